"""Load-aware placement of prompt prefixes (issue 17): a new prefix goes to the endpoint with the most
headroom, a holder keeps its prefix within the load bound (and over it while its engine reports room),
a saturated holder's hot prefix gains exactly one more holder, and the holders share it by load."""

from __future__ import annotations

import time
from collections.abc import Sequence

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.config import RoutingConfig
from corral.router.routing.load_board import EngineLoad, LoadBoard
from corral.router.routing.pipeline import PREFIX_WEIGHTS, RING_PREFIX_WEIGHTS, ScoredPolicy
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import build_scored

SYSTEM = "You are a careful assistant for the sea charts team. " * 20


def fleet(n: int) -> list[Endpoint]:
    return [Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(n)]


def request(group: int, user: int = 0) -> RouteRequest:
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"group {group}: {SYSTEM}"},
            {"role": "user", "content": f"user {user}"},
        ],
    }
    return RouteRequest("m", {}, payload)


def board_of(endpoints: list[Endpoint], **by_index: EngineLoad) -> LoadBoard:
    """Fresh metrics for every endpoint: idle, except those given by index (`e0=EngineLoad(...)`)."""
    board = LoadBoard(stale_after=1e6)
    for i, e in enumerate(endpoints):
        load = by_index.get(f"e{i}", EngineLoad())
        load.at = time.monotonic()
        board.loads[e.url] = load
    return board


def policy(board: LoadBoard, memory: PrefixMemory, weights: dict[str, float] | None = None) -> ScoredPolicy:
    return ScoredPolicy("prefix", weights or PREFIX_WEIGHTS, board, eps=1.0, seed=3, holders=memory)


def test_a_new_prefix_goes_to_the_endpoint_with_the_most_headroom() -> None:
    endpoints = fleet(4)
    board = board_of(
        endpoints,
        e0=EngineLoad(running=4, waiting=1),
        e1=EngineLoad(running=2),
        e2=EngineLoad(running=1, kv_usage=0.2),
        e3=EngineLoad(running=3),
    )
    for group in range(5):  # whatever the prompt's hash, the quietest engine
        assert policy(board, PrefixMemory()).pick(endpoints, request(group)) is endpoints[2]


def test_a_new_prefix_goes_where_the_router_placed_fewest_prefixes() -> None:
    """Live loads alike and no recent picks (a router that just started, or a `--workers` sibling whose
    picks it learnt through the journal): a new group goes to an engine that was placed fewest prefixes,
    whatever its hash. Issue 28's sweep draws 14 and 17 ended with [4, 4, 6, 8] keys per engine for 20
    groups; the fuller caches thrashed. Without the footprint scorer, ring order decides."""
    endpoints = fleet(4)
    without = {name: w for name, w in PREFIX_WEIGHTS.items() if name != "footprint"}

    def placements(weights: dict[str, float]) -> set[str]:
        chosen = set()
        for group in range(12):
            memory = PrefixMemory()
            for i, count in enumerate((8, 6, 4, 4)):
                for n in range(count):
                    memory.sent(request(1000 + 100 * i + n), endpoints[i])
            scored = ScoredPolicy("prefix", weights, board_of(endpoints), eps=1.0, seed=group, holders=memory)
            chosen.add(scored.pick(endpoints, request(group)).url)
        return chosen

    assert placements(dict(PREFIX_WEIGHTS)) == {endpoints[2].url, endpoints[3].url}
    assert placements(without) - {endpoints[2].url, endpoints[3].url}


def test_two_workers_placing_new_prefixes_at_once_split_them_by_the_prompt() -> None:
    """Two `--workers` siblings with the same view (neither has read the other's pick yet) each place a
    different new group at the same instant: near-equal totals are split by the prompt's ring order, so
    the two groups do not both land on the one engine whose total is a hair ahead (sweep draw 4: 7
    groups on one engine of 4, 26x the oracle's p90)."""
    endpoints = fleet(4)
    # idle engines whose KV usage differs by noise: e1 a hair ahead of e2 and e3
    board = board_of(
        endpoints, e1=EngineLoad(kv_usage=0.0), e2=EngineLoad(kv_usage=0.01), e3=EngineLoad(kv_usage=0.02)
    )
    same = 0
    for pair in range(12):
        chosen = []
        for group in (2 * pair, 2 * pair + 1):
            memory = PrefixMemory()
            memory.sent(request(900), endpoints[0])  # the same history on both siblings
            scored = ScoredPolicy("prefix", PREFIX_WEIGHTS, board, eps=1.0, seed=7, holders=memory)
            chosen.append(scored.pick(endpoints, request(group)).url)
        same += chosen[0] == chosen[1]
        assert endpoints[0].url not in chosen  # the engine with a prefix more is not near-equal
    assert same <= 6, f"{same} of 12 concurrent pairs went to one engine"


def test_a_prefix_with_holders_is_not_placed_by_footprint() -> None:
    """A held prompt goes to its holder, however many prefixes that engine was placed."""
    endpoints = fleet(2)
    a, b = endpoints
    memory = PrefixMemory()
    board = board_of(endpoints)
    scored = policy(board, memory)
    for group in range(6):
        memory.sent(request(100 + group), a)
    memory.sent(request(1), a)
    assert memory.placed(a) == 7 and memory.placed(b) == 0
    assert scored.pick(endpoints, request(1, user=5)) is a
    assert scored.pick(endpoints, request(2)) is b  # a new one: the emptier engine


def test_new_prefixes_on_an_idle_fleet_spread_evenly_not_by_hash() -> None:
    """One at a time (nothing in flight, no queue anywhere): the engine handed the last new prefixes
    is not the quietest any more, so twelve groups land three per engine, where ring homes do not."""
    endpoints = fleet(4)
    memory = PrefixMemory()
    scored = policy(board_of(endpoints), memory)
    homes = [scored.pick(endpoints, request(g)) for g in range(12)]
    assert sorted(homes.count(e) for e in endpoints) == [3, 3, 3, 3]
    ring = ScoredPolicy("prefix", RING_PREFIX_WEIGHTS, board_of(endpoints), seed=3, placement="ring")
    by_ring = [ring.pick(endpoints, request(g)) for g in range(12)]
    assert sorted(by_ring.count(e) for e in endpoints) != [3, 3, 3, 3]  # these groups hash unevenly
    for g, home in enumerate(homes):  # and each group stays where it was placed
        assert scored.pick(endpoints, request(g, user=1)) is home


def test_a_holder_keeps_its_prefix_over_the_bound_while_its_engine_has_room() -> None:
    endpoints = fleet(4)
    memory = PrefixMemory()
    scored = policy(board_of(endpoints), memory)
    home = scored.pick(endpoints, request(7))
    home.in_flight = 1  # over ceil(2 * 2 / 4) = 1 with every other engine idle
    assert scored.pick(endpoints, request(7, user=1)) is home
    endpoints = fleet(4)
    a = endpoints[0]
    strict = policy(LoadBoard(), PrefixMemory())  # no metrics: the bound alone decides
    strict.pick([a], request(7))
    a.in_flight = 1
    assert strict.pick(endpoints, request(7, user=1)) is not a


def test_a_saturated_holder_gains_exactly_one_more_holder() -> None:
    endpoints = fleet(4)
    memory = PrefixMemory()
    board = board_of(endpoints)
    scored = policy(board, memory)
    home = scored.pick(endpoints, request(5))
    home.in_flight = 6
    board.loads[home.url].waiting = 3  # the engine queues: saturated
    picked = []
    for user in range(8):
        e = scored.pick(endpoints, request(5, user))
        e.in_flight += 1
        picked.append(e)
    key = memory.key(request(5))
    assert key is not None
    holders = memory.holding(key, endpoints)
    assert len(holders) == 2 and home in holders
    second = next(e for e in holders if e is not home)
    assert picked == [second] * 8  # not spilled over the other engines


def test_the_holders_of_a_prefix_share_it_by_load() -> None:
    endpoints = fleet(4)
    memory = PrefixMemory()
    a, b = endpoints[1], endpoints[2]
    key_request = request(9)
    memory.sent(key_request, a)
    memory.sent(key_request, b)
    scored = policy(board_of(endpoints), memory)
    picked = []
    for user in range(10):
        e = scored.pick(endpoints, request(9, user))
        e.in_flight += 1
        picked.append(e)
    assert picked.count(a) == picked.count(b) == 5


def test_the_ring_placement_is_a_routing_config_choice() -> None:
    config = RoutingConfig.model_validate(
        {"policies": {"prefix-ring": {"weights": dict(RING_PREFIX_WEIGHTS), "placement": "ring"}}}
    )
    ring = build_scored("prefix-ring", config, LoadBoard(), "x-session-id", 1, PrefixMemory())
    assert ring.placement == "ring"
    built_in = build_scored("prefix", config, LoadBoard(), "x-session-id", 1, PrefixMemory())
    assert built_in.placement == "headroom"  # the default until cost prices what a copy evicts
    by_cost = RoutingConfig.model_validate({"prefix_placement": "cost"})
    assert build_scored("prefix", by_cost, LoadBoard(), "x-session-id", 1, PrefixMemory()).placement == "cost"


def test_an_idle_prefix_held_twice_stays_on_one_holder() -> None:
    """Recent picks place new prefixes only: with nothing in flight, a prefix two engines hold goes to
    the same one every time (ring order), so it does not fill both caches."""
    endpoints = fleet(4)
    memory = PrefixMemory()
    a, b = endpoints[0], endpoints[3]
    memory.sent(request(4), a)
    memory.sent(request(4), b)
    scored = policy(board_of(endpoints), memory)
    picked = {scored.pick(endpoints, request(4, user)).url for user in range(6)}
    assert len(picked) == 1 and picked <= {a.url, b.url}


class FixedShares:
    """A `PrefixHolders` answer with graded shares, as the KV-event index gives (longest held prefix)."""

    def __init__(self, shares: dict[str, float]) -> None:
        self.shares = shares
        self.taught: list[str] = []

    def held(self, request: RouteRequest, pool: Sequence[Endpoint]) -> list[float]:
        return [self.shares.get(e.url, 0.0) for e in pool]

    def sent(self, request: RouteRequest, endpoint: Endpoint) -> None:
        self.taught.append(endpoint.url)

    def holders(self, request: RouteRequest) -> list[str]:
        return [url for url, share in self.shares.items() if share > 0]

    def placed(self, endpoint: Endpoint) -> int:
        return self.taught.count(endpoint.url)


def test_graded_shares_place_by_the_same_rule() -> None:
    """With the KV-event index's graded shares: the longest holder wins while loads are alike, a
    nearly-as-long holder takes over when the longest is busier, and the pick is taught back."""
    endpoints = fleet(4)
    a, b, c, _ = endpoints
    holders = FixedShares({a.url: 0.3, b.url: 0.9, c.url: 0.85})
    board = board_of(endpoints)
    scored = ScoredPolicy("prefix", PREFIX_WEIGHTS, board, eps=1.0, seed=3, holders=holders)
    assert scored.pick(endpoints, request(1)) is b
    b.in_flight = 2
    board.loads[b.url].running = 2
    assert scored.pick(endpoints, request(1)) is c
    assert holders.taught == [b.url, c.url]


def test_a_holder_over_the_bound_keeps_its_prefix_until_two_requests_wait_there() -> None:
    # one request waiting on the holder is less than the copy would cost: its prefill elsewhere and, on a
    # cache at capacity, what it evicts there (issue 28: spilling at the first waiting request set off
    # thrash cascades); two waiting is a queue deeper than one prefill
    endpoints = fleet(4)
    board = board_of(endpoints)
    scored = policy(board, PrefixMemory())
    home = scored.pick(endpoints, request(9))
    home.in_flight = 3  # over ceil(2 * 4 / 4) = 2 with every other engine idle
    board.loads[home.url].waiting = 1
    assert scored.pick(endpoints, request(9, user=1)) is home
    board.loads[home.url].waiting = 2
    assert scored.pick(endpoints, request(9, user=2)) is not home


def test_a_late_scrape_does_not_send_a_prompt_off_its_holder() -> None:
    # the holder's figures are older than the board's staleness bound: they still say it has room, and a
    # scrape running late (a busy host) confirms nothing, so the holder keeps its prefix
    endpoints = fleet(4)
    board = board_of(endpoints)
    board.stale_after = 1.0
    scored = policy(board, PrefixMemory())
    home = scored.pick(endpoints, request(4))
    home.in_flight = 3
    for e in endpoints:
        board.loads[e.url].at = time.monotonic() - 30.0  # every scrape late
    assert board.fresh(home.url) is None
    assert scored.pick(endpoints, request(4, user=1)) is home
    board.loads[home.url].waiting = 5  # its last figures say it queues: that is a confirmation
    assert scored.pick(endpoints, request(4, user=2)) is not home
