"""Scorers: each rates every candidate in [0, 1] (higher is better) from one signal; the pipeline
adds them up with per-model weights. A scorer never does I/O and never removes a candidate."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.policies import RouteRequest


@dataclass(slots=True)
class PickContext:
    """One pick: the request, every eligible endpoint (rings are built over these, so that the order
    of a key's homes does not change with load), the scraped loads and the time."""

    request: RouteRequest
    eligible: Sequence[Endpoint]
    board: LoadBoard
    now: float = field(default_factory=time.monotonic)


class Scorer(Protocol):
    name: str

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        """One score in [0, 1] per endpoint of `pool`, in order."""
        ...
