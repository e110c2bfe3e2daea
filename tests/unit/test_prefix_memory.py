"""The router's prefix memory: bounded per endpoint, preferred by the prefix scorer over the ring home
while the holder is within the load bound, and forgotten when the engine's prefix cache was emptied
(its supervisor's prefix epoch moved), when a new endpoint takes the address, or when it leaves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.routing.config import RoutingConfig
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.pipeline import PREFIX_WEIGHTS, ScoredPolicy
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest
from corral.router.routing.selector import Routing, build_policy

SYSTEM = "You are a careful assistant for the sea charts team. " * 20


def endpoint(i: int, epoch: str | None = None) -> Endpoint:
    view = SupervisorView(f"http://10.0.1.{i}:9000", prefix_epoch=epoch) if epoch is not None else None
    return Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY, supervisor=view)


def request(group: int) -> RouteRequest:
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"group {group}: {SYSTEM}"},
            {"role": "user", "content": "q"},
        ],
    }
    return RouteRequest("m", {}, payload)


def scored(memory: PrefixMemory | None, seed: int = 0) -> ScoredPolicy:
    return ScoredPolicy("prefix", PREFIX_WEIGHTS, LoadBoard(), eps=0.25, seed=seed, holders=memory)


def group_homed_on(pool: list[Endpoint], home: Endpoint) -> int:
    """A prompt group whose ring home in `pool` is `home` (for a policy without memory)."""
    ring_only = scored(None)
    return next(g for g in range(200) if ring_only.pick(pool, request(g)) is home)


def test_each_endpoint_keeps_at_most_its_capacity_least_recent_first() -> None:
    memory = PrefixMemory(keys_per_endpoint=3)
    a = endpoint(1)
    for key in (1, 2, 3):
        memory.remember(key, a)
    memory.remember(1, a)  # 1 is the most recent now
    memory.remember(4, a)  # evicts 2
    assert memory.placed(a) == 3
    assert [k for k in (1, 2, 3, 4) if memory.holding(k, [a])] == [1, 3, 4]
    with pytest.raises(ValueError, match="at least 1"):
        PrefixMemory(keys_per_endpoint=0)


def test_the_engine_that_holds_a_prefix_wins_over_the_ring_home() -> None:
    a, b = endpoint(1), endpoint(2)
    g = group_homed_on([a, b], b)
    memory = PrefixMemory()
    policy = scored(memory)
    assert policy.pick([a], request(g)) is a  # alone, a cached the group's prefix
    assert memory.placed(a) == 1
    assert policy.pick([a, b], request(g)) is a  # b joined and is the ring home; a still holds it
    assert scored(None).pick([a, b], request(g)) is b  # without memory: the ring home


def test_an_overloaded_holder_spills_to_the_ring_order() -> None:
    a, b = endpoint(1), endpoint(2)
    g = group_homed_on([a, b], b)
    memory = PrefixMemory()
    policy = scored(memory)
    policy.pick([a], request(g))
    a.in_flight = 10  # over ceil(1.25 * 11 / 2) = 7
    assert policy.pick([a, b], request(g)) is b
    assert memory.holding(memory_key(policy, [a, b], g), [a, b]) == [a, b]  # b caches it now too


def memory_key(policy: ScoredPolicy, pool: list[Endpoint], group: int) -> int:
    from corral.router.routing.scorers import PickContext, PrefixScorer

    prefix = policy.scorers[0][0]
    assert isinstance(prefix, PrefixScorer)
    key = prefix.key(PickContext(request(group), pool, LoadBoard()))
    assert key is not None
    return key


def test_a_new_prefix_epoch_forgets_the_engine_and_the_ring_decides_again() -> None:
    a, b = endpoint(1, epoch="101:0"), endpoint(2, epoch="202:0")
    g = group_homed_on([a, b], b)
    memory = PrefixMemory()
    policy = scored(memory)
    policy.pick([a], request(g))
    assert policy.pick([a, b], request(g)) is a
    assert a.supervisor is not None
    a.supervisor.prefix_epoch = "101:1"  # the supervisor reset a's prefix cache (sleep, reload)
    assert memory.placed(a) == 0
    assert memory.to_json(a) == {"keys": 0, "capacity": memory.keys_per_endpoint, "prefix_epoch": None}
    assert policy.pick([a, b], request(g)) is b
    assert memory.forgotten == 1


def test_a_new_endpoint_at_the_same_address_starts_empty_and_forget_drops_one() -> None:
    memory = PrefixMemory()
    old, other = endpoint(1), endpoint(2)
    memory.remember(7, old)
    memory.remember(7, other)
    assert memory.holding(7, [endpoint(1)]) == []  # a new object: another engine
    memory.forget(other.url, "left membership")
    assert memory.placed(other) == 0


def test_replicas_agree_on_keys_no_engine_holds() -> None:
    pool_a = [endpoint(i) for i in range(4)]
    pool_b = [endpoint(i) for i in range(4)]
    a, b = scored(PrefixMemory(), seed=1), scored(PrefixMemory(), seed=2)
    for g in range(30):
        assert a.pick(pool_a, request(g)).url == b.pick(pool_b, request(g)).url


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 8),
    sends=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), max_size=80),
)
def test_memory_stays_bounded_and_answers_within_the_pool(
    capacity: int, sends: list[tuple[int, int]]
) -> None:
    endpoints = [endpoint(i) for i in range(4)]
    memory = PrefixMemory(keys_per_endpoint=capacity)
    for i, key in sends:
        memory.remember(key, endpoints[i])
        assert memory.placed(endpoints[i]) <= capacity
    for key in range(21):
        held = memory.holding(key, endpoints[:2])
        assert all(e in endpoints[:2] for e in held)


def test_routing_shares_one_memory_across_its_scored_policies() -> None:
    routing = Routing("prefix", RoutingConfig(), "x-session-id", list)
    a = endpoint(1)
    routing.policy.pick([a], request(3))
    assert routing.prefix_memory.placed(a) == 1
    assert isinstance(build_policy("prefix"), ScoredPolicy)


def test_the_state_line_reads_the_prefix_epoch_leniently() -> None:
    from corral.contracts.supervisor import StateLine, decode_watch_line

    line = b'{"type": "state", "epoch": 3, "state": "READY", "prefix_epoch": "4242:2"}'
    decoded = decode_watch_line(line)
    assert isinstance(decoded, StateLine) and decoded.prefix_epoch == "4242:2"
    odd = decode_watch_line(b'{"type": "state", "epoch": 3, "state": "READY", "prefix_epoch": 7}')
    assert isinstance(odd, StateLine) and odd.prefix_epoch is None  # read, not refused


def rag(document: int, question: int) -> RouteRequest:
    """A system prompt common to every request (longer than the first key), a document, a question."""
    body = f"Document {document}. " + f"Chapter {document} of the charts, tide tables. " * 40
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{body}\nQuestion {question}?"},
        ],
    }
    return RouteRequest("m", {}, payload)


def test_a_system_prompt_every_engine_holds_neither_hides_nor_places_the_document() -> None:
    pool = [endpoint(i) for i in range(4)]
    memory = PrefixMemory()
    policy = scored(memory)
    for e in pool:  # each engine was sent the common system prompt alone
        memory.sent(
            RouteRequest("m", {}, {"model": "m", "messages": [{"role": "system", "content": SYSTEM}]}), e
        )
    shares = memory.held(rag(0, 0), pool)
    assert len(set(shares)) == 1 and 0 < shares[0] < 1  # the common start, alike on every engine
    homes = [policy.pick(pool, rag(d, 0)) for d in range(4)]
    assert len({e.url for e in homes}) == 4  # new documents spread by headroom, not by the common start
    for q in range(1, 6):
        for d in range(4):
            assert policy.pick(pool, rag(d, q)) is homes[d]  # each later question follows its document
    assert memory.held(rag(1, 9), pool) == [1.0 if e is homes[1] else shares[0] for e in pool]


def session(user: int, turns: int) -> RouteRequest:
    """An agent's session: a tool prompt common to every session, then its own growing history (each
    turn longer than the tool prompt)."""
    messages = [{"role": "system", "content": f"{SYSTEM * 2} Session {user}."}]
    for k in range(turns + 1):
        messages.append(
            {"role": "user", "content": f"Step {k} of session {user}: " + "chart the tide. " * 150}
        )
    return RouteRequest("m", {}, {"model": "m", "messages": messages})


def test_sessions_behind_a_common_tool_prompt_spread_and_keep_their_history() -> None:
    pool = [endpoint(i) for i in range(4)]
    policy = scored(PrefixMemory())
    homes = [policy.pick(pool, session(u, 0)) for u in range(4)]
    assert len({e.url for e in homes}) == 4  # the first session's engine holds the tool prompt: no pile-up
    for turn in range(1, 8):
        for u in range(4):
            assert policy.pick(pool, session(u, turn)) is homes[u]  # each turn follows its history


def test_a_short_system_prompt_is_followed_though_it_is_shorter_than_the_first_key() -> None:
    """A 400-character system prompt: its users' prompts share no 512-character key (the question is in
    it), but they share the keys inside it, so the engine that served the group holds most of the next
    user's prompt and the pick follows it (three real vLLM CPU engines, issue 28)."""
    system = "You answer questions about tide tables for the harbour office. " * 7  # 441 characters
    fleet = [endpoint(i) for i in range(4)]
    memory = PrefixMemory()
    policy = scored(memory)

    def user(u: int) -> RouteRequest:
        question = f"When is high water on day {u} of the spring tides, and how high at the pier? " * 2
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return RouteRequest("m", {}, {"messages": messages})

    home = policy.pick(fleet, user(0))
    shares = memory.held(user(1), fleet)
    assert shares[fleet.index(home)] >= 0.5 and sorted(shares)[:3] == [0.0, 0.0, 0.0]
    assert all(policy.pick(fleet, user(u)) is home for u in range(1, 8))
