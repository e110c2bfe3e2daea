"""The keyed work queue: the latest state per key wins, a key is never worked on twice at once, and
nothing put is lost — a deletion put while the key is being worked on comes back after `done`."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.k8s.watch.workqueue import KeyedQueue, QueueShutDown


async def test_latest_state_per_key_wins_and_order_is_first_put() -> None:
    q: KeyedQueue[str, str] = KeyedQueue()
    q.put("a", "a1")
    q.put("b", "b1")
    q.put("a", "a2")
    q.put("a", "deleted")
    assert len(q) == 2
    assert await q.get() == ("a", "deleted")
    assert await q.get() == ("b", "b1")
    assert len(q) == 0


async def test_a_key_being_worked_on_is_not_handed_out_again_and_its_delete_is_not_lost() -> None:
    q: KeyedQueue[str, str] = KeyedQueue()
    q.put("a", "added")
    key, state = await q.get()
    assert (key, state) == ("a", "added")
    q.put("a", "modified")
    q.put("a", "deleted")  # arrives while a worker holds "a"
    q.put("b", "added")
    assert q.processing == frozenset({"a"})
    assert await q.get() == ("b", "added")  # not "a": it is still held
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.done("a")
    assert await asyncio.wait_for(getter, 1) == ("a", "deleted")


async def test_shut_down_drains_then_stops_waiters() -> None:
    q: KeyedQueue[str, int] = KeyedQueue()
    q.put("a", 1)
    q.shut_down()
    assert await q.get() == ("a", 1)
    try:
        await q.get()
    except QueueShutDown:
        pass
    else:
        raise AssertionError("get after shut_down and drain must raise QueueShutDown")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abc"), st.integers(0, 5)),
        st.tuples(st.just("take"), st.integers(0, 2), st.none()),
        st.tuples(st.just("finish"), st.integers(0, 2), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_after_any_interleaving_every_key_ends_processed_with_its_last_state(
    script: list[tuple[str, object, object]],
) -> None:
    """Three workers take and finish keys in any order while states (0 = deleted) are put; once
    everything is drained, the last state each worker saw for a key is the last one put."""

    async def run() -> None:
        q: KeyedQueue[str, int] = KeyedQueue()
        last_put: dict[str, int] = {}
        last_done: dict[str, int] = {}
        held: list[tuple[str, int] | None] = [None, None, None]

        async def take(worker: int) -> None:
            if held[worker] is None and len(q):
                key, state = await q.get()
                assert all(h is None or h[0] != key for h in held), "a key was handed out twice"
                held[worker] = (key, state)

        def finish(worker: int) -> None:
            item = held[worker]
            if item is not None:
                last_done[item[0]] = item[1]
                held[worker] = None
                q.done(item[0])

        for op, arg, value in script:
            if op == "put":
                assert isinstance(arg, str) and isinstance(value, int)
                q.put(arg, value)
                last_put[arg] = value
            elif op == "take":
                assert isinstance(arg, int)
                await take(arg)
            else:
                assert isinstance(arg, int)
                finish(arg)
        for w in range(3):
            finish(w)
        while len(q):
            await take(0)
            finish(0)
        assert last_done == last_put

    asyncio.run(run())
