"""Scorers: each rates every candidate in [0, 1] (higher is better) from one signal; a scored policy
adds them up with per-model weights. A scorer never does I/O and never removes a candidate; the load
signals come from the `LoadBoard` the scraper fills, stale or missing entries scoring as saturated."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import EngineLoad, LoadBoard
from corral.router.routing.prefix_holders import PrefixHolders
from corral.router.routing.prefix_memory import DEFAULT_BLOCK_CHARS, DEFAULT_KEY_BLOCKS
from corral.router.routing.prompt import request_prefix_key
from corral.router.routing.request import RouteRequest
from corral.router.routing.rings import RingCache, stable_hash

SCORER_NAMES = ("prefix", "queue", "kv_usage", "in_flight", "recent", "footprint", "lora", "session")
PLACEMENTS = ("cost", "headroom", "ring")
# A prompt is a new placement unless some endpoint holds at least this share more than another of what
# the least holder lacks: a document or a session behind a system prompt that some engines hold is new,
# and would otherwise follow the common start onto the engines that hold it. A new placement is made
# by headroom alone (the prefix scorer scores 0, the recent-picks scorer counts).
HELD_MARGIN = 0.5


def placed_by_holders(shares: Sequence[float]) -> bool:
    """Whether some endpoint holds enough more of the prompt than another to place it (`HELD_MARGIN`);
    a start common to all, or a short one held by some, places nothing."""
    low, high = min(shares, default=0.0), max(shares, default=0.0)
    return high - low >= HELD_MARGIN * (1.0 - low)


@dataclass(slots=True)
class PickContext:
    """One pick: the request, every eligible endpoint (rings are built over these, so that the order
    of a key's homes does not change with load), the scraped loads and the time."""

    request: RouteRequest
    eligible: Sequence[Endpoint]
    board: LoadBoard
    now: float = field(default_factory=time.monotonic)
    prefix_key: int | None = None  # set by the prefix scorer: the prompt's key on the ring
    # set by the prefix scorer: some endpoint of the pool holds enough more of the prompt than another
    # (`HELD_MARGIN`); a short start held by some (a system prompt common to many prompts) leaves the
    # prompt's placement to headroom
    held: bool = False
    # set by the prefix scorer with holders: the share of the prompt each endpoint of the pool holds
    shares: list[float] | None = None
    _loads_of: Sequence[Endpoint] | None = None
    _loads: list[EngineLoad | None] | None = None

    def loads(self, pool: Sequence[Endpoint]) -> list[EngineLoad | None]:
        """Each endpoint's scraped load, None when stale or missing: looked up once per pick and pool,
        for every scorer that reads it."""
        if self._loads is None or self._loads_of is not pool:
            board, now = self.board, self.now
            self._loads = [board.fresh(e.url, now) for e in pool]
            self._loads_of = pool
        return self._loads


class Scorer(Protocol):
    name: str

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        """One score in [0, 1] per endpoint of `pool`, in order."""
        ...


class PrefixScorer:
    """Prefix affinity. With a `PrefixHolders` answer (the router's memory of its picks, or the
    engines' KV events), an endpoint scores the share of the prompt's prefix it holds: a holder scores
    1, an endpoint that never saw the prefix 0, and the load scorers decide among equals, so a prefix
    no engine holds goes to the endpoint with the most headroom and a prefix held by two is spread
    over both by load (`placement="headroom"`, docs/ARCHITECTURE.md). A prompt that no endpoint holds
    enough more of than another (`HELD_MARGIN`: a new document behind a common system prompt) scores 0
    everywhere: it is placed by headroom, not after the common start.

    Without holders, or with `placement="ring"` (the placement before issue 17, kept to compare
    against), the prompt's leading blocks have a home found by consistent hashing over the eligible
    endpoints: the holders first (in ring order), then the home 1, the next endpoint clockwise 1/2,
    the next 1/4, ...; endpoints the load-bound filter removed are skipped, so an overloaded home
    spills to the same second endpoint on every replica. A prompt shorter than one block has no key:
    every endpoint scores 0."""

    name = "prefix"

    def __init__(
        self,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        key_blocks: int = DEFAULT_KEY_BLOCKS,
        holders: PrefixHolders | None = None,
        placement: str = "headroom",
    ) -> None:
        self.block_chars = block_chars
        self.key_blocks = key_blocks
        self.holders = holders
        self.by_ring = holders is None or placement == "ring"
        self.rings = RingCache()

    def key(self, ctx: PickContext) -> int | None:
        if ctx.prefix_key is None:
            ctx.prefix_key = request_prefix_key(ctx.request, self.block_chars, self.key_blocks)
        return ctx.prefix_key

    def home_order(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[Endpoint] | None:
        """`pool` in ring order from the prompt's key, holders first; None when the prompt has no key."""
        key = self.key(ctx)
        if key is None:
            return None
        order = self.rings.ring(ctx.eligible).ordered(key, pool)
        if self.holders is not None:
            shares = self.holders.held(ctx.request, order)
            held = [e for e, share in zip(order, shares, strict=True) if share > 0]
            if held and held[0] is not order[0]:
                first = {id(e) for e in held}
                order = held + [e for e in order if id(e) not in first]
        return order

    def first_on_ring(self, tied: Sequence[Endpoint], ctx: PickContext) -> Endpoint | None:
        """Of endpoints that scored alike, the first clockwise from the prompt's key (so replicas with
        the same membership and loads agree); None when the prompt has no key."""
        key = self.key(ctx)
        if key is None:
            return None
        return self.rings.ring(ctx.eligible).first(key, tied)

    def learn(self, chosen: Endpoint, ctx: PickContext) -> None:
        """The pick is made: `chosen` will cache the prompt's prefix."""
        if self.holders is not None:
            self.holders.sent(ctx.request, chosen)

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        if not self.by_ring:
            assert self.holders is not None
            shares = ctx.shares = self.holders.held(ctx.request, pool)
            ctx.held = placed_by_holders(shares)
            return shares if ctx.held else [0.0] * len(pool)
        order = self.home_order(pool, ctx)
        if order is None:
            return [0.0] * len(pool)
        rank = {id(e): 0.5**i for i, e in enumerate(order)}
        return [rank.get(id(e), 0.0) for e in pool]


class RecentScorer:
    """Fewer of this router's recent picks is better: a count per endpoint that halves every
    `half_life` seconds. It is the headroom signal that outlives a request: an idle fleet's in-flight
    and queues are all zero, but the endpoint that was handed the last new prefixes will serve their
    later turns, so the next new prefix goes elsewhere. It places prompts that no endpoint of the pool
    holds half of more than another (a new document behind a common system prompt is new):
    among a prefix's holders the live load decides (then ring order), so a prefix held twice is
    served by one holder while that one is not busier, and does not fill both caches."""

    name = "recent"

    def __init__(self, half_life: float = 30.0) -> None:
        self.half_life = half_life
        self._decay = math.log(2.0) / half_life
        self._counts: dict[str, tuple[float, float]] = {}  # url -> (count, at)

    def count(self, url: str, now: float) -> float:
        entry = self._counts.get(url)
        if entry is None:
            return 0.0
        count, at = entry
        return count * math.exp(self._decay * (at - now))

    def picked(self, endpoint: Endpoint, now: float) -> None:
        counts = self._counts
        counts[endpoint.url] = (self.count(endpoint.url, now) + 1.0, now)
        if len(counts) > 4096:  # endpoints long gone: drop what has decayed to nothing
            for url in [u for u in counts if self.count(u, now) < 0.01]:
                del counts[url]

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        if ctx.held:
            return [0.0] * len(pool)
        counts = [self.count(e.url, ctx.now) for e in pool]
        worst = max(counts, default=0.0) + 1.0
        return [1.0 - c / worst for c in counts]


class FootprintScorer:
    """Fewer prompt prefixes this router has placed on the endpoint (and still counts there: its memory,
    bounded per endpoint, emptied with the engine's prefix cache) is better, for a new placement only.
    The recent picks fade in seconds and the live loads read a moment late; the placed prefixes are what
    the caches will have to hold. Without it, a burst of new prefixes (a warm-up, or two `--workers`
    reading each other's picks late) left one engine with twice another's prefixes, whose cache then
    thrashed: up to 28x the oracle's TTFT p90 in 2 of 20 sweep draws (RESULTS.md, issue 28). A prompt
    that holders place (`PickContext.held`) is not scored."""

    name = "footprint"

    def __init__(self, holders: PrefixHolders | None) -> None:
        self.holders = holders

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        holders = self.holders
        if holders is None or ctx.held:
            return [0.0] * len(pool)
        # relative to the fewest: one prefix more than the least-placed endpoint costs the same at 2 as at
        # 200 (against the most, it cost a fifth at 4 and nothing once counts grew)
        counts = [holders.placed(e) for e in pool]
        fewest = min(counts, default=0)
        span = max(counts, default=0) - fewest + 1
        return [1.0 - (c - fewest) / span for c in counts]


class QueueScorer:
    """Fewer requests running plus waiting on the engine (its own `/metrics`) is better; an engine
    whose metrics are stale or missing scores as the most loaded."""

    name = "queue"

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        # A waiting request costs more than a running one: it has not even started prefill.
        queues = [None if load is None else load.running + 2.0 * load.waiting for load in ctx.loads(pool)]
        worst = max((q for q in queues if q is not None), default=0.0) + 1.0
        return [0.0 if q is None else 1.0 - q / worst for q in queues]


class KvUsageScorer:
    """More free KV cache is better (room for this prompt without evicting others' prefixes); stale
    or missing metrics score as full."""

    name = "kv_usage"

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        return [0.0 if load is None else max(0.0, 1.0 - load.kv_usage) for load in ctx.loads(pool)]


class InFlightScorer:
    """Fewer of this router's requests open at the engine (all of its workers' on this host) is better.
    Always current (no scrape), but blind to other router replicas' traffic; the queue scorer sees
    that, a scrape late."""

    name = "in_flight"

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        flights = [e.host_in_flight for e in pool]
        worst = max(flights) + 1
        return [1.0 - f / worst for f in flights]


class LoraScorer:
    """An engine already running the requested adapter (its `vllm:lora_requests_info`) scores 1, one
    that has it registered (it serves the name in /v1/models) 1/2, any other 0. Requests for a base
    model are not scored."""

    name = "lora"

    def __init__(self, base_models: frozenset[str] = frozenset()) -> None:
        self.base_models = base_models

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        model = ctx.request.model
        if model in self.base_models:
            return [0.0] * len(pool)
        out: list[float] = []
        for e, load in zip(pool, ctx.loads(pool), strict=True):
            if load is not None and model in load.running_adapters:
                out.append(1.0)
            elif model in e.models:
                out.append(0.5)
            else:
                out.append(0.0)
        return out


class SessionScorer:
    """The endpoint that a session header's value hashes to on the ring scores 1, the others 0;
    requests without the header are not scored."""

    name = "session"

    def __init__(self, header: str = "x-session-id") -> None:
        self.header = header
        self._rings = RingCache()

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        session = ctx.request.headers.get(self.header)
        if not session:
            return [0.0] * len(pool)
        allowed = {id(e) for e in pool}
        for e in self._rings.ring(ctx.eligible).walk(stable_hash(session)):
            if id(e) in allowed:
                return [1.0 if x is e else 0.0 for x in pool]
        return [0.0] * len(pool)


def build_scorer(
    name: str,
    *,
    block_chars: int,
    key_blocks: int,
    session_header: str,
    holders: PrefixHolders | None = None,
    placement: str = "headroom",
) -> Scorer:
    if name == "prefix":
        return PrefixScorer(block_chars, key_blocks, holders, placement)
    if name == "recent":
        return RecentScorer()
    if name == "footprint":
        return FootprintScorer(holders)
    if name == "queue":
        return QueueScorer()
    if name == "kv_usage":
        return KvUsageScorer()
    if name == "in_flight":
        return InFlightScorer()
    if name == "lora":
        return LoraScorer()
    if name == "session":
        return SessionScorer(session_header)
    raise ValueError(f"unknown scorer {name!r}; choose among {', '.join(SCORER_NAMES)}")
