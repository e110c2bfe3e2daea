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
_MAPPED = re.compile(r"Mapped (?P<tensors>\d+) tensors from the weight cache daemon \((?P<mode>\w+) mode\)")
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

    def note(self, line: str) -> None:
        found = mapped_in(line)
        if found is not None:
            self.mapped.append(found)
        elif _FALLBACK in line.lower():
            self.fallbacks.append(line[:500])

    def to_json(self) -> dict[str, Any]:
        return {
            "mapped": [{"tensors": m.tensors, "mode": m.mode, "line": m.line} for m in self.mapped],
            "fallbacks": list(self.fallbacks),
        }
