"""A scored policy: the eligible endpoints within the load bound, weighted scorers added up, the best
taken; endpoints that score alike are told apart by the prompt's ring order (so replicas agree), else
at random (so an idle fleet is not herded onto its first endpoint).

Placement of prompt prefixes (`placement="headroom"`, the default): a prompt goes to an endpoint that
holds its prefix while that endpoint is within the load bound; a prefix no endpoint holds goes to the
endpoint with the most headroom (the load scorers: queue, in-flight, free KV, recent picks); when
every holder is over the bound and its engine confirms it is full (requests waiting, or its KV cache
full), the prompt goes to the endpoint with the most headroom, which then holds the prefix too, so a
hot prefix gains one more holder at a time and its later requests spread over its holders by load.
An engine over the bound that reports room (nothing waiting) keeps its prefixes: a batching engine
takes another request of a cached prefix at a fraction of the cost of a full prefill elsewhere."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.filters import candidates_for, favored, load_bound
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.prefix_holders import PrefixHolders
from corral.router.routing.prefix_memory import DEFAULT_BLOCK_CHARS, DEFAULT_KEY_BLOCKS
from corral.router.routing.request import RouteRequest
from corral.router.routing.scorers import (
    PLACEMENTS,
    PickContext,
    PrefixScorer,
    RecentScorer,
    Scorer,
    build_scorer,
)

# A holder scores 1 and an endpoint without the prefix 0; the load scorers sum to less than 1/2, so a
# holder within the bound always wins (and, by ring, the home wins over the next endpoint clockwise,
# whose prefix score is 1/2), and the load scorers choose among holders and for new prefixes.
PREFIX_WEIGHTS: Mapping[str, float] = {
    "prefix": 1.0,
    "queue": 0.15,
    "recent": 0.15,
    "in_flight": 0.1,
    "kv_usage": 0.05,
}
# The placement before issue 17 (ring homes, the strict in-flight bound), for comparisons.
RING_PREFIX_WEIGHTS: Mapping[str, float] = {"prefix": 1.0, "queue": 0.2, "in_flight": 0.15, "kv_usage": 0.1}
LOAD_WEIGHTS: Mapping[str, float] = {"queue": 0.5, "in_flight": 0.35, "kv_usage": 0.15}
TIE = 1e-9
# An engine whose KV cache is this full has no room for another prompt without preempting or evicting.
KV_FULL = 0.95


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
        placement: str = "headroom",
    ) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r}: choose one of {', '.join(PLACEMENTS)}")
        self.name = name
        self.eps = eps
        self.board = board
        self.weights = dict(weights)
        self.placement = placement
        self.scorers: list[tuple[Scorer, float]] = [
            (
                build_scorer(
                    scorer,
                    block_chars=block_chars,
                    key_blocks=key_blocks,
                    session_header=session_header,
                    holders=holders,
                    placement=placement,
                ),
                weight,
            )
            # the prefix scorer first: the others read what it found (PickContext.held)
            for scorer, weight in sorted(weights.items(), key=lambda item: item[0] != "prefix")
            if weight
        ]
        self._random = random.Random(seed)
        self._prefix = next((s for s, _ in self.scorers if isinstance(s, PrefixScorer)), None)
        self._recent = next((s for s, _ in self.scorers if isinstance(s, RecentScorer)), None)
        # Over the bound, an engine that reports room keeps its prefixes; by ring, the bound is strict.
        self._room_counts = placement == "headroom"
        # Told of each pick (request, endpoint, whether the prefix holders learnt it): the sibling workers
        # of `--workers N` learn it too (`worker_journal`); None with one worker.
        self.on_pick: Callable[[RouteRequest, Endpoint, bool], None] | None = None

    @property
    def uses_metrics(self) -> bool:
        return any(s.name in ("queue", "kv_usage", "lora") for s, _ in self.scorers)

    def scores(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], list[float]]:
        """The endpoints a pick may choose and their weighted totals (for tests and /v1/fleet)."""
        pool, totals, _ = self._scored(candidates, request)
        return pool, totals

    def within_bound(
        self,
        candidates: Sequence[Endpoint],
        now: float,
        among: Sequence[Endpoint] | None = None,
        bound: int | None = None,
    ) -> list[Endpoint]:
        """The candidates (those of `among`, when given) under the load bound of all the candidates
        (`bound`, when the caller has it), and those over it whose engine reports room."""
        if bound is None:
            bound = load_bound(candidates, self.eps)
        among = candidates if among is None else among
        if not self._room_counts:
            return [e for e in among if e.host_in_flight < bound]
        board = self.board
        pool = []
        for e in among:
            if e.host_in_flight < bound:
                pool.append(e)
                continue
            load = board.fresh(e.url, now)
            if load is not None and load.waiting == 0 and load.kv_usage < KV_FULL:
                pool.append(e)
        return pool

    def _scored(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], list[float], PickContext]:
        ctx = PickContext(request, candidates, self.board, time.monotonic())
        # a large fleet: the prompt's holders and ring home and a sample, not every endpoint (filters)
        bound = load_bound(candidates, self.eps)
        sample = candidates_for(candidates, self._random, lambda: favored(self._prefix, ctx, bound))
        pool = self.within_bound(candidates, ctx.now, sample, bound)
        if not pool:  # every one of the sample is over the bound (rare): all of them, as before
            pool = self.within_bound(candidates, ctx.now, bound=bound)
        totals = [0.0] * len(pool)
        for scorer, weight in self.scorers:
            totals = [t + weight * s for t, s in zip(totals, scorer.score(pool, ctx), strict=True)]
        return pool, totals, ctx

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        if len(candidates) == 1:
            chosen = candidates[0]
            ctx = PickContext(request, candidates, self.board)
        else:
            pool, totals, ctx = self._scored(candidates, request)
            best = max(totals)
            ties = [pool[i] for i, t in enumerate(totals) if t >= best - TIE]
            if len(ties) == 1:
                chosen = ties[0]
            else:
                by_ring = self._prefix.first_on_ring(ties, ctx) if self._prefix is not None else None
                chosen = by_ring if by_ring is not None else self._random.choice(ties)
        if self._prefix is not None:  # what it caches now it keeps when others join
            self._prefix.learn(chosen, ctx)
        if self._recent is not None:
            self._recent.picked(chosen, ctx.now)
        if self.on_pick is not None:
            self.on_pick(request, chosen, self._prefix is not None and self._prefix.holders is not None)
        return chosen

    def recent_pick(self, endpoint: Endpoint, now: float) -> None:
        """A sibling worker picked `endpoint` with this policy: it counts among the recent picks."""
        if self._recent is not None:
            self._recent.picked(endpoint, now)
