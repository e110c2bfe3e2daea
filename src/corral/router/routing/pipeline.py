"""A scored policy: the eligible endpoints within the load bound, weighted scorers added up, the best
taken; endpoints that score alike are told apart by the prompt's ring order (so replicas agree), else
at random (so an idle fleet is not herded onto its first endpoint).

Placement by cost (`placement="cost"`, the `prefix` policy's since issue 28): of the endpoints within
the load bound, the prompt goes to the one where its first token is expected soonest, in prefill tokens
(`prefill_cost`: the prefill queued ahead of it, its decodes' price, and the prompt less what that
endpoint holds of it); a prompt whose start is common to all (`scorers.HELD_MARGIN`) is priced as new
everywhere. Endpoints expected alike are told apart by fewer recent picks (for a new placement: the
endpoint handed the last new prefixes will serve their later turns), then by ring order.

Placement of prompt prefixes (`placement="headroom"`, the default): a prompt goes to an endpoint that
holds its prefix while that endpoint is within the load bound; a prefix no endpoint holds goes to the
endpoint with the most headroom (the load scorers: queue, in-flight, free KV, recent picks); when
every holder is over the bound and its engine confirms it is full (by its last figures: `SPILL_WAITING`
requests waiting, or its KV cache full), the prompt goes to the endpoint with the most headroom, which
then holds the prefix too, so a hot prefix gains one more holder at a time and its later requests spread
over its holders by load. An engine over the bound that reports room (fewer waiting) keeps its prefixes:
a batching engine takes another request of a cached prefix at a fraction of the cost of a full prefill
elsewhere, and a copy evicts what the other engine serves. An engine with no figures yet is held to the
bound alone."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.cache_feedback import CacheFeedback
from corral.router.routing.filters import candidates_for, favored, load_bound
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.prefill_cost import CHARS_PER_TOKEN, PrefillCost
from corral.router.routing.prefix_holders import PrefixHolders
from corral.router.routing.prefix_memory import DEFAULT_BLOCK_CHARS, DEFAULT_KEY_BLOCKS, PrefixMemory
from corral.router.routing.prompt import request_prefix_keys
from corral.router.routing.request import RouteRequest
from corral.router.routing.scorers import (
    PLACEMENTS,
    PickContext,
    PrefixScorer,
    RecentScorer,
    Scorer,
    build_scorer,
    placed_by_holders,
)

# A holder scores 1 and an endpoint without the prefix 0; the scorers that rate a held prompt (queue,
# in-flight, KV usage) sum to less than 1/2, so a holder within the bound always wins (and, by ring, the
# home wins over the next endpoint clockwise, whose prefix score is 1/2), and they choose among holders.
# A new prefix (no holder) is placed by all but the prefix scorer: the live loads, the recent picks and
# the prefixes already placed on each endpoint (footprint). Footprint weighs most of those: the scraped
# queue and KV usage are up to a scrape old and the in-flight counts last one request, while the
# prefixes placed are what each cache must hold; at 0.1 (scored against the most-placed), a stale queue
# figure still put two of four concurrent new groups on one engine (sweep draw 14: 5/3/4/4 groups in 2 of
# 10 runs); at 0.2 against the least-placed, 4/4/4/4 in 7 of 7 (RESULTS.md, issue 28).
PREFIX_WEIGHTS: Mapping[str, float] = {
    "prefix": 1.0,
    "queue": 0.15,
    "recent": 0.15,
    "in_flight": 0.1,
    "footprint": 0.2,
    "kv_usage": 0.05,
}
# The placement before issue 17 (ring homes, the strict in-flight bound), for comparisons.
RING_PREFIX_WEIGHTS: Mapping[str, float] = {"prefix": 1.0, "queue": 0.2, "in_flight": 0.15, "kv_usage": 0.1}
LOAD_WEIGHTS: Mapping[str, float] = {"queue": 0.5, "in_flight": 0.35, "kv_usage": 0.15}
TIE = 1e-9
# A new prefix's placement: totals this close are alike, and the prompt's ring order chooses among them.
# Every `--workers` sibling (and every replica) sees the same loads and footprints and nearly the same
# recent picks; with the strict best, two of them placing two new prefixes at the same instant (before
# either reads the other's pick) chose the same engine for both whenever noise (an idle engine's KV
# usage, a recent pick's decay) put it a hair ahead, and an engine given two more groups than its peers
# fell off its cache's cliff (sweep draw 4: 7 groups on one engine of 4, 26x the oracle's TTFT p90, not
# one spill). Ring order splits near-equals by the prompt, so concurrent placements spread; a
# difference that matters still decides: a request running or waiting more (0.15 / (the busiest + 1)
# from the queue scorer, 0.0125 up to 11), a request in flight, a recent pick, a prefix placed.
NEW_TIE = 0.005
# Cost estimates (prefill tokens) this close are alike.
TIE_TOKENS = 0.5
# A new placement prices each of an endpoint's recent picks (decaying, `RecentScorer`) at this share of a
# typical prompt: the later requests of the prefixes it was handed (agentic preset: without it, new
# sessions went to whichever engine decoded least at that instant, p90 1.31-1.35x the oracle's).
RECENT_SHARE = 0.1
# An engine whose KV cache is this full has no room for another prompt without preempting or evicting.
KV_FULL = 0.95
# An engine over the load bound keeps its prefixes while fewer than this many requests wait there. A copy
# elsewhere costs the prompt's prefill there and, that engine's cache being full of what it serves, about
# as much again when what it evicted is asked for: it pays only when the holder's queue is deeper than one
# prefill. Spilling at the first waiting request (issues 17-28) set off cascades on caches at capacity —
# one copy evicts a group, its next request misses and queues, which spills another: 7-25x the oracle's
# TTFT p90 in 5 of 20 sweep draws (RESULTS.md, issue 28).
SPILL_WAITING = 2


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
        self._room_counts = placement != "ring"
        self.block_chars = block_chars
        self.key_blocks = key_blocks
        # by cost: the prefix scorer's holders and ring, the recent picks to tell alike ones apart
        self.cost = (
            PrefillCost(block_chars)
            if placement == "cost" and self._prefix is not None and self._prefix.holders is not None
            else None
        )
        # on the router's own memory (by headroom or by cost): an engine's answer that says it cached far
        # less than the memory expected corrects the memory (cache_feedback)
        self.feedback = (
            CacheFeedback(holders)
            if self._prefix is not None and placement != "ring" and isinstance(holders, PrefixMemory)
            else None
        )
        # Told of each pick (request, endpoint, whether the prefix holders learnt it): the sibling workers
        # of `--workers N` learn it too (`worker_journal`); None with one worker.
        self.on_pick: Callable[[RouteRequest, Endpoint, bool], None] | None = None
        # With `--workers N`: the host's lock on new placements (`placement_lock`), which also reads what
        # the siblings placed since this pick began; None with one worker.
        self.placing: Callable[[], AbstractContextManager[None]] | None = None

    @property
    def uses_metrics(self) -> bool:
        return self.cost is not None or any(s.name in ("queue", "kv_usage", "lora") for s, _ in self.scorers)

    def scores(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], list[float]]:
        """The endpoints a pick may choose and their weighted totals (for tests and /v1/fleet); by cost,
        each one's expected prefill tokens before the prompt's first token, negated (higher is better)."""
        if self.cost is not None:
            pool, ctx = self._pool(candidates, request)
            estimates = self._estimates(pool, ctx)[0]
            return pool, [-x for x in estimates]
        pool, totals, _ = self._scored(candidates, request)
        return pool, totals

    def within_bound(
        self,
        candidates: Sequence[Endpoint],
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
        loads = self.board.loads
        pool = []
        for e in among:
            if e.host_in_flight < bound:
                pool.append(e)
                continue
            # the engine's last figures, however old: a scrape that is late confirms nothing (on a busy
            # host, reading only fresh figures sent prompts off their holders whenever a scrape ran late)
            load = loads.get(e.url)
            if load is not None and load.waiting < SPILL_WAITING and load.kv_usage < KV_FULL:
                pool.append(e)
        return pool

    def _pool(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], PickContext]:
        ctx = PickContext(request, candidates, self.board, time.monotonic())
        # a large fleet: the prompt's holders and ring home and a sample, not every endpoint (filters)
        bound = load_bound(candidates, self.eps)
        sample = candidates_for(candidates, self._random, lambda: favored(self._prefix, ctx, bound))
        pool = self.within_bound(candidates, sample, bound)
        if not pool:  # every one of the sample is over the bound (rare): all of them, as before
            pool = self.within_bound(candidates, bound=bound)
        return pool, ctx

    def _estimates(
        self, pool: Sequence[Endpoint], ctx: PickContext
    ) -> tuple[list[float], list[float], list[float], float]:
        """By cost: each endpoint's expected prefill tokens before the prompt's first token, the
        prompt's uncached tokens there, the characters of the prompt it holds, and the prompt's."""
        cost, prefix = self.cost, self._prefix
        assert cost is not None and prefix is not None and prefix.holders is not None
        keys = request_prefix_keys(ctx.request, self.block_chars, self.key_blocks)
        keyed = keys[-1][1] / CHARS_PER_TOKEN if keys else 0.0
        prompt = cost.prompt_tokens(keys[-1][1] if keys else 0)
        held = prefix.holders.held(ctx.request, pool) if keys else [0.0] * len(pool)
        ctx.held = placed_by_holders(held)
        # a start common to all places nothing: each is priced at the least held
        shares = held if ctx.held else [min(held, default=0.0)] * len(pool)
        estimates, uncached = cost.estimates(pool, ctx.loads(pool), shares, prompt, keyed)
        if not ctx.held and self._recent is not None:
            # A new placement decides where the prefix's later requests go: the engines handed the most
            # recent picks have the most of them coming (the recent picks, priced as future prefills).
            recent, now, price = self._recent, ctx.now, RECENT_SHARE * (cost.typical or prompt)
            estimates = [x + price * recent.count(e.url, now) for x, e in zip(estimates, pool, strict=True)]
        chars = keyed * CHARS_PER_TOKEN
        return estimates, uncached, [share * chars for share in held], prompt * CHARS_PER_TOKEN

    def _by_cost(self, candidates: Sequence[Endpoint], request: RouteRequest) -> tuple[Endpoint, PickContext]:
        pool, ctx = self._pool(candidates, request)
        estimates, uncached, held, prompt_chars = self._estimates(pool, ctx)
        best = min(estimates)
        ties = [i for i, x in enumerate(estimates) if x <= best + TIE_TOKENS]
        if len(ties) > 1 and not ctx.held and self._recent is not None:
            recent, now = self._recent, ctx.now
            counts = [recent.count(pool[i].url, now) for i in ties]
            fewest = min(counts)
            ties = [i for i, c in zip(ties, counts, strict=True) if c <= fewest + TIE]
        if len(ties) == 1:
            i = ties[0]
        else:
            tied = [pool[i] for i in ties]
            by_ring = self._prefix.first_on_ring(tied, ctx) if self._prefix is not None else None
            chosen = by_ring if by_ring is not None else self._random.choice(tied)
            i = next(i for i in ties if pool[i] is chosen)
        assert self.cost is not None
        self.cost.picked(uncached[i])
        request.prefill_tokens = max(1, round(uncached[i]))
        if self.feedback is not None and held[i] > 0:
            self.feedback.expect(request, pool[i], held[i], prompt_chars)
        return pool[i], ctx

    def _scored(
        self, candidates: Sequence[Endpoint], request: RouteRequest
    ) -> tuple[list[Endpoint], list[float], PickContext]:
        pool, ctx = self._pool(candidates, request)
        totals = [0.0] * len(pool)
        for scorer, weight in self.scorers:
            totals = [t + weight * s for t, s in zip(totals, scorer.score(pool, ctx), strict=True)]
        return pool, totals, ctx

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        if len(candidates) == 1:
            chosen = candidates[0]
            ctx = PickContext(request, candidates, self.board)
        elif self.cost is not None:
            chosen, ctx = self._by_cost(candidates, request)
        else:
            pool, totals, ctx = self._scored(candidates, request)
            if not ctx.held and self._prefix is not None and self.placing is not None:
                # a new placement: one worker of the host at a time, each seeing the last one's pick; scored
                # again under the lock (the first scoring only found that nobody holds the prompt)
                with self.placing():
                    pool, totals, ctx = self._scored(candidates, request)
                    chosen = self._best(pool, totals, ctx)
                    self._record(request, chosen, ctx)
                return chosen
            chosen = self._best(pool, totals, ctx)
        self._record(request, chosen, ctx)
        return chosen

    def _best(self, pool: Sequence[Endpoint], totals: Sequence[float], ctx: PickContext) -> Endpoint:
        best = max(totals)
        alike = NEW_TIE if self._prefix is not None and not ctx.held else TIE
        ties = [pool[i] for i, t in enumerate(totals) if t >= best - alike]
        if len(ties) == 1:
            chosen = ties[0]
        else:
            by_ring = self._prefix.first_on_ring(ties, ctx) if self._prefix is not None else None
            chosen = by_ring if by_ring is not None else self._random.choice(ties)
        if self.feedback is not None and ctx.shares is not None:
            self._expect_hit(pool, ctx, chosen)
        return chosen

    def _record(self, request: RouteRequest, chosen: Endpoint, ctx: PickContext) -> None:
        """The pick is made: the prefix holders, the recent picks and the sibling workers learn it."""
        if self._prefix is not None:  # what it caches now it keeps when others join
            self._prefix.learn(chosen, ctx)
        if self._recent is not None:
            self._recent.picked(chosen, ctx.now)
        if self.on_pick is not None:
            self.on_pick(request, chosen, self._prefix is not None and self._prefix.holders is not None)

    def _expect_hit(self, pool: Sequence[Endpoint], ctx: PickContext, chosen: Endpoint) -> None:
        """The pick expects `chosen` to hold its share of the prompt: its answer may say otherwise."""
        assert self.feedback is not None and ctx.shares is not None
        share = next(s for e, s in zip(pool, ctx.shares, strict=True) if e is chosen)
        keys = request_prefix_keys(ctx.request, self.block_chars, self.key_blocks)
        if share > 0 and keys:
            chars = float(keys[-1][1])
            self.feedback.expect(ctx.request, chosen, share * chars, chars)

    def recent_pick(self, endpoint: Endpoint, now: float) -> None:
        """A sibling worker picked `endpoint` with this policy: it counts among the recent picks."""
        if self._recent is not None:
            self._recent.picked(endpoint, now)
