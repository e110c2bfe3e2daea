"""A scored policy: filter the eligible endpoints by the load bound, add up weighted scorers, take the
best (ties broken at random, so an idle fleet is not herded onto its first endpoint)."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.filters import within_load_bound
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.prefix_holders import PrefixHolders
from corral.router.routing.prefix_memory import DEFAULT_BLOCK_CHARS, DEFAULT_KEY_BLOCKS
from corral.router.routing.request import RouteRequest
from corral.router.routing.scorers import (
    PickContext,
    PrefixScorer,
    Scorer,
    build_scorer,
)

# Prefix weight 1 and the load scorers summing to less than 1/2 (the gap between the home's prefix
# score and the next endpoint's): the home within the load bound always wins, so replicas agree; the
# load scorers only order the rest and pick for prompts without a key.
PREFIX_WEIGHTS: Mapping[str, float] = {"prefix": 1.0, "queue": 0.2, "in_flight": 0.15, "kv_usage": 0.1}
LOAD_WEIGHTS: Mapping[str, float] = {"queue": 0.5, "in_flight": 0.35, "kv_usage": 0.15}
TIE = 1e-9


class ScoredPolicy:
    def __init__(
        self,
        name: str,
        weights: Mapping[str, float],
        board: LoadBoard,
        *,
        eps: float = 1.0,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        key_blocks: int = DEFAULT_KEY_BLOCKS,
        session_header: str = "x-session-id",
        seed: int | None = None,
        holders: PrefixHolders | None = None,
    ) -> None:
        self.name = name
        self.eps = eps
        self.board = board
        self.weights = dict(weights)
        self.scorers: list[tuple[Scorer, float]] = [
            (
                build_scorer(
                    scorer,
                    block_chars=block_chars,
                    key_blocks=key_blocks,
                    session_header=session_header,
                    holders=holders,
                ),
                weight,
            )
            for scorer, weight in weights.items()
            if weight
        ]
        self._random = random.Random(seed)
        # the prefix scorer that learns from each pick (None without a memory to teach)
        self._learner = next(
            (s for s, _ in self.scorers if isinstance(s, PrefixScorer) and s.holders is not None), None
        )

    @property
    def uses_metrics(self) -> bool:
        return any(s.name in ("queue", "kv_usage", "lora") for s, _ in self.scorers)

    def scores(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], list[float]]:
        """The endpoints within the load bound and their weighted totals (for tests and /v1/fleet)."""
        pool, totals, _ = self._scored(candidates, request)
        return pool, totals

    def _scored(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], list[float], PickContext]:
        pool = within_load_bound(candidates, self.eps)
        ctx = PickContext(request, candidates, self.board, time.monotonic())
        totals = [0.0] * len(pool)
        for scorer, weight in self.scorers:
            for i, s in enumerate(scorer.score(pool, ctx)):
                totals[i] += weight * s
        return pool, totals, ctx

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        learner = self._learner
        if len(candidates) == 1:
            chosen = candidates[0]
            if learner is not None:  # what it caches now it keeps when others join
                ctx = PickContext(request, candidates, self.board)
                learner.key(ctx)
                learner.learn(chosen, ctx)
            return chosen
        pool, totals, ctx = self._scored(candidates, request)
        best = max(totals)
        ties = [i for i, t in enumerate(totals) if t >= best - TIE]
        chosen = pool[ties[0] if len(ties) == 1 else self._random.choice(ties)]
        if learner is not None:
            learner.learn(chosen, ctx)
        return chosen
