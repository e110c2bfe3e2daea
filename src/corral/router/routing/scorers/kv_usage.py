"""KV usage: more free KV cache is better (room for this prompt without evicting others' prefixes);
stale or missing metrics score as full."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.scorers import PickContext


class KvUsageScorer:
    name = "kv_usage"

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        board, now = ctx.board, ctx.now
        out: list[float] = []
        for e in pool:
            load = board.fresh(e.url, now)
            out.append(0.0 if load is None else max(0.0, 1.0 - load.kv_usage))
        return out
