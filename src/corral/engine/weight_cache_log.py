"""What an engine started with `--load-format ipc_cache` logged about its weights: vLLM's
`Mapped N tensors from the weight cache daemon (MODE mode)` (model_executor/model_loader/weight_cache/
ipc_loader.py, INFO, once per rank that mapped them) or its `Weight cache unusable (…); falling back to
disk loading` warning. The Mapped line is the only evidence on vLLM's surface that the weights came from
the daemon: `/health`, `/v1/models` and a smoke completion answer the same after a disk load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAPPED_LINE = "Mapped N tensors from the weight cache daemon (MODE mode)"
# bounded: a count of at most 12 digits (int() of a 5,000-digit run raises), a mode of at most 32 letters
_MAPPED = re.compile(
    r"Mapped (?P<tensors>\d{1,12}) tensors from the weight cache daemon \((?P<mode>\w{1,32}) mode\)"
)
# A run keeps this many Mapped lines (one per rank: TP x PP x local DP) and fallback warnings; more are
# only counted, so an engine that repeats a line cannot grow the supervisor's state.
KEPT_LINES = 256
_FALLBACK = "falling back to disk loading"


@dataclass(frozen=True)
class Mapped:
    tensors: int
    mode: str
    line: str


def mapped_in(line: str) -> Mapped | None:
    match = _MAPPED.search(line)
    if match is None:
        return None
    return Mapped(int(match["tensors"]), match["mode"], line[:500])


@dataclass
class WeightCacheLog:
    """One run's Mapped lines (one per rank that mapped) and fallback warnings."""

    mapped: list[Mapped] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    dropped: int = 0  # lines past KEPT_LINES, counted only

    def note(self, line: str) -> None:
        found = mapped_in(line)
        kept = found is not None or _FALLBACK in line.lower()
        if kept and len(self.mapped) + len(self.fallbacks) >= KEPT_LINES:
            self.dropped += 1
        elif found is not None:
            self.mapped.append(found)
        elif kept:
            self.fallbacks.append(line[:500])

    def to_json(self) -> dict[str, Any]:
        return {
            "mapped": [{"tensors": m.tensors, "mode": m.mode, "line": m.line} for m in self.mapped],
            "fallbacks": list(self.fallbacks),
            "dropped": self.dropped,
        }
