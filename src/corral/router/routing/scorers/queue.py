"""Queue: fewer requests running plus waiting on the engine (its own `/metrics`) is better; an engine
whose metrics are stale or missing scores as the most loaded."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.scorers import PickContext


class QueueScorer:
    name = "queue"

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        board, now = ctx.board, ctx.now
        queues: list[float | None] = []
        for e in pool:
            load = board.fresh(e.url, now)
            # A waiting request costs more than a running one: it has not even started prefill.
            queues.append(None if load is None else load.running + 2.0 * load.waiting)
        worst = max((q for q in queues if q is not None), default=0.0) + 1.0
        return [0.0 if q is None else 1.0 - q / worst for q in queues]
