"""The simulator's chat rendering is `corral.engine.sim_chat` (below the router, which renders the same
way). Only a re-export for `sim/http/app.py`, which imports it from here while other work on it is
uncommitted; to be removed once it imports `corral.engine.sim_chat` (issue 31)."""

from __future__ import annotations

from corral.engine.sim_chat import render_chat

__all__ = ["render_chat"]
