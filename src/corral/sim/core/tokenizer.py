"""The simulator's tokenizer is `corral.engine.sim_tokenizer` (below the router, which tokenizes the
same way). Only a re-export for `sim/core/engine.py` and `sim/server.py`, which import it from here
while other work on them is uncommitted; to be removed once they import `corral.engine.sim_tokenizer`
(issue 31)."""

from __future__ import annotations

from corral.engine.sim_tokenizer import ToyTokenizer

__all__ = ["ToyTokenizer"]
