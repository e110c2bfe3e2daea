"""LoRA affinity: an engine already running the requested adapter (its `vllm:lora_requests_info`)
scores 1, one that has it registered (it serves the name in /v1/models) 1/2, any other 0. Requests for
a base model are not scored."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.scorers import PickContext


class LoraScorer:
    name = "lora"

    def __init__(self, base_models: frozenset[str] = frozenset()) -> None:
        self.base_models = base_models

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        model = ctx.request.model
        if model in self.base_models:
            return [0.0] * len(pool)
        board, now = ctx.board, ctx.now
        out: list[float] = []
        for e in pool:
            load = board.fresh(e.url, now)
            if load is not None and model in load.running_adapters:
                out.append(1.0)
            elif model in e.models:
                out.append(0.5)
            else:
                out.append(0.0)
        return out
