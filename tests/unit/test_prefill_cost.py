"""Placement by cost (issue 28): a prompt goes where its first token is expected soonest, in prefill
tokens: the prefill queued ahead of it, its decodes' price, and the prompt less what the engine holds.
A hit is worth what it saves, no more."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import EngineLoad, LoadBoard
from corral.router.routing.pipeline import PREFIX_WEIGHTS, ScoredPolicy
from corral.router.routing.prefill_cost import PrefillCost
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest

SYSTEM = "You are a careful assistant for the sea charts team. " * 20  # ~1,060 characters


def fleet(n: int) -> list[Endpoint]:
    return [Endpoint(f"http://10.0.1.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(n)]


def request(group: int, user: int = 0, system: str = SYSTEM) -> RouteRequest:
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"group {group}: {system}"},
            {"role": "user", "content": f"user {user}"},
        ],
    }
    return RouteRequest("m", {}, payload)


def idle_board(endpoints: list[Endpoint]) -> LoadBoard:
    board = LoadBoard(stale_after=1e6)
    for e in endpoints:
        board.loads[e.url] = EngineLoad(at=time.monotonic())
    return board


def by_cost(board: LoadBoard, memory: PrefixMemory) -> ScoredPolicy:
    return ScoredPolicy("prefix", PREFIX_WEIGHTS, board, eps=1.0, seed=3, holders=memory, placement="cost")


def queue(endpoint: Endpoint, requests: int, tokens: int) -> None:
    """`requests` of this router at `endpoint` before their first byte, `tokens` to prefill in all."""
    for _ in range(requests):
        endpoint.in_flight += 1
        endpoint.prefill_sent(tokens // requests)


def test_a_holder_keeps_its_prefix_while_its_queue_is_shorter_than_what_the_hit_saves() -> None:
    endpoints = fleet(2)
    memory = PrefixMemory()
    policy = by_cost(idle_board(endpoints), memory)
    holder = policy.pick(endpoints, request(1))
    other = endpoints[1] if holder is endpoints[0] else endpoints[0]
    prompt = request(1, user=1)
    queue(holder, 1, 100)  # ~270 tokens saved by the hit, 100 queued: the hit wins
    assert policy.pick(endpoints, prompt) is holder
    assert 0 < prompt.prefill_tokens < 100  # only what the holder lacks
    queue(holder, 1, 400)  # 500 queued: an idle engine computes the whole prompt sooner
    spilled = request(1, user=2)
    assert policy.pick(endpoints, spilled) is other
    assert spilled.prefill_tokens > 200  # the whole prompt there
    # the idle engine holds the prefix too now: the next request goes to the shorter queue of the two
    assert policy.pick(endpoints, request(1, user=3)) is other


def test_the_engines_own_waiting_requests_count_at_a_typical_prompt() -> None:
    """Another replica's burst, seen only in the holder's /metrics, moves the prompt off the holder."""
    endpoints = fleet(2)
    memory = PrefixMemory()
    board = idle_board(endpoints)
    policy = by_cost(board, memory)
    holder = policy.pick(endpoints, request(1))
    other = endpoints[1] if holder is endpoints[0] else endpoints[0]
    board.loads[holder.url] = EngineLoad(running=2, at=time.monotonic())  # decoding, none waiting
    assert policy.pick(endpoints, request(1, user=1)) is holder
    board.loads[holder.url] = EngineLoad(waiting=3, running=2, at=time.monotonic())
    assert policy.pick(endpoints, request(1, user=2)) is other


def test_a_start_common_to_all_places_nothing_and_new_prefixes_spread() -> None:
    """Twelve new groups on an idle fleet spread three per engine (recent picks, then ring order);
    a request whose short start one engine holds (a system prompt) is placed as new."""
    endpoints = fleet(4)
    memory = PrefixMemory()
    policy = by_cost(idle_board(endpoints), memory)
    homes = [policy.pick(endpoints, request(g)) for g in range(12)]
    assert sorted(homes.count(e) for e in endpoints) == [3, 3, 3, 3]
    for g, home in enumerate(homes):
        assert policy.pick(endpoints, request(g, user=1)) is home
    tool = "Tools: search, read, write. " * 8  # 224 characters: held by one engine after this pick
    first = policy.pick(endpoints, RouteRequest("m", {}, {"prompt": tool + "x" * 2000}))
    queue(first, 1, 50)
    second = policy.pick(endpoints, RouteRequest("m", {}, {"prompt": tool + "y" * 2000}))
    assert second is not first  # its tenth held by `first` places nothing: the shorter queue wins


def test_before_any_pick_the_prompt_is_the_typical_one() -> None:
    cost = PrefillCost(block_chars=128)
    e = fleet(1)[0]
    # nothing known of typical prompts yet: a waiting request costs this prompt's tokens
    estimates, uncached = cost.estimates([e], [EngineLoad(waiting=1)], [0.0], prompt=300.0, keyed=284.0)
    assert uncached == [300.0] and estimates == [600.0]
    cost.picked(100.0)
    estimates, _ = cost.estimates([e], [EngineLoad(waiting=1)], [1.0], prompt=300.0, keyed=284.0)
    assert estimates == [100.0 + 16.0]


@settings(deadline=None, max_examples=200)
@given(
    queued=st.lists(st.integers(0, 5_000), min_size=2, max_size=6),
    waiting=st.lists(st.integers(0, 8), min_size=6, max_size=6),
    held=st.lists(st.booleans(), min_size=6, max_size=6),
    chars=st.integers(0, 20_000),
)
def test_the_pick_is_the_least_expected_prefill(
    queued: list[int], waiting: list[int], held: list[bool], chars: int
) -> None:
    """Whatever the queues, the engines' waiting counts and the holders, the pick's estimate is the
    least of the pool's."""
    endpoints = fleet(len(queued))
    memory = PrefixMemory()
    board = idle_board(endpoints)
    policy = by_cost(board, memory)
    prompt = RouteRequest("m", {}, {"prompt": "q" * chars})
    for e, tokens, w, h in zip(endpoints, queued, waiting, held, strict=False):
        if tokens:
            queue(e, 1, tokens)
        board.loads[e.url] = EngineLoad(waiting=w, at=time.monotonic())
        if h:
            memory.sent(prompt, e)
    pool, scores = policy.scores(endpoints, prompt)
    chosen = policy.pick(endpoints, prompt)
    assert scores[pool.index(chosen)] >= max(scores) - 0.5


@settings(deadline=None, max_examples=200)
@given(
    tokens=st.integers(0, 100_000),
    requests=st.integers(0, 50),
    in_flight=st.integers(0, 50),
    waiting=st.integers(0, 50),
    running=st.integers(0, 50),
    share=st.floats(0.0, 1.0),
    keyed=st.floats(0.0, 50_000.0),
    typical=st.floats(0.0, 10_000.0),
)
def test_a_hit_saves_what_it_holds_and_a_queue_costs_what_it_queues(
    tokens: int,
    requests: int,
    in_flight: int,
    waiting: int,
    running: int,
    share: float,
    keyed: float,
    typical: float,
) -> None:
    cost = PrefillCost(128)
    cost.picked(typical)
    e = fleet(1)[0]
    e.host_in_flight, e.host_prefilling, e.host_prefill_tokens = in_flight + requests, requests, tokens
    load = EngineLoad(waiting=waiting, running=running)
    prompt = keyed + 16.0
    (held,), (uncached,) = cost.estimates([e], [load], [share], prompt, keyed)
    (new,), _ = cost.estimates([e], [load], [0.0], prompt, keyed)
    assert uncached == prompt - share * keyed >= 16.0 - 1e-9
    assert abs(new - held - share * keyed) <= 1e-6 * max(1.0, new)  # the hit saves what it holds
    e.host_prefill_tokens += 1000
    (longer,), _ = cost.estimates([e], [load], [share], prompt, keyed)
    assert abs(longer - held - 1000) <= 1e-6 * max(1.0, longer)  # the queue adds what it queues
    assert held >= uncached  # a wait is never negative
