"""Router replicas share their picks (`--peer`, issue 28): one replica's log (`routing.pick_log`, read
from its worker journals) is applied by another (`routing.peer_follower`) as a sibling worker's pick
is, only for endpoints it has; the page between them is bounded and read strictly
(`routing.peer_wire`). Two replicas are two routing stacks here, each on journals of its own, the page
passed as bytes between them as HTTP would."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.peer_follower import PeerFollower
from corral.router.routing.peer_wire import (
    MAX_PAGE_BYTES,
    MAX_PAGE_PICKS,
    PeerPage,
    PeerPick,
    PeerWireError,
    decode_page,
    encode_page,
    parse_cursor,
)
from corral.router.routing.pick_log import PickLog
from corral.router.routing.prompt import MAX_KEYS
from corral.router.routing.worker_journal import PICKS_KEPT, WorkerJournals, hash_epoch
from tests.unit.test_worker_journal import MODEL, Worker, request

ENGINES = 4


class Replica:
    """One router replica of `workers` workers: its journals, its workers' routing stacks, the log
    it serves and a follower of its peer."""

    def __init__(self, name: str, workers: int = 1) -> None:
        self.journals = WorkerJournals(workers)
        self.workers = [Worker(self.journals, k, ENGINES) for k in range(1, workers + 1)]
        first = self.workers[0]
        assert first.sync is not None
        self.log = PickLog(first.sync, name)
        self.follower: PeerFollower | None = None

    def follow(self, peer: Replica) -> None:
        first = self.workers[0]
        assert first.sync is not None
        self.follower = PeerFollower(
            f"http://{peer.log.incarnation}",
            "token",
            first.membership.get,
            first.memory,
            first.routing.selector.policies,
            first.sync,
            relay=len(self.workers) > 1,
        )

    def poll(self, peer: Replica) -> None:
        """What one poll does, the page through its bytes; again while the peer has more."""
        assert self.follower is not None
        more = True
        while more:
            page = decode_page(encode_page(peer.log.page(parse_cursor(self.follower.cursor))))
            more = asyncio.run(self.follower.take(page))


def split(replicas: list[Replica], groups: int, turns: int, peered: bool) -> dict[int, set[str]]:
    """Each group's requests taken by the replicas in turn, each replica polling its peer before
    each of its picks when `peered`: the engines each group went to."""
    placed: dict[int, set[str]] = {g: set() for g in range(groups)}
    k = 0
    for turn in range(turns):
        for g in range(groups):
            mine = replicas[k % 2]
            if peered:
                mine.poll(replicas[(k + 1) % 2])
            placed[g].add(mine.workers[k // 2 % len(mine.workers)].pick(g, turn))
            k += 1
    return placed


def peered_pair(workers: int = 1) -> list[Replica]:
    replicas = [Replica("a", workers), Replica("b", workers)]
    replicas[0].follow(replicas[1])
    replicas[1].follow(replicas[0])
    return replicas


def test_a_prefix_one_replica_placed_is_held_by_its_peer() -> None:
    replicas = peered_pair()
    placed = split(replicas, groups=11, turns=6, peered=True)
    assert all(len(engines) == 1 for engines in placed.values()), placed
    assert len(set().union(*placed.values())) == ENGINES  # the groups still spread over every engine
    for replica in replicas:
        worker = replica.workers[0]
        assert sum(worker.memory.placed(e) for e in worker.membership.endpoints()) == 11


def test_without_peers_two_replicas_split_prefixes() -> None:
    placed = split([Replica("a"), Replica("b")], groups=11, turns=6, peered=False)
    assert any(len(engines) > 1 for engines in placed.values())


def test_with_workers_the_peers_picks_reach_every_worker_and_are_not_served_back() -> None:
    replicas = peered_pair(workers=2)
    placed = split(replicas, groups=9, turns=4, peered=True)
    assert all(len(engines) == 1 for engines in placed.values()), placed
    # a page holds only the picks its router made: 9 * 4 requests, half on each router
    for replica in replicas:
        page = replica.log.page([])
        assert len(page.picks) == 18 and not page.more
    for replica in replicas:
        for worker in replica.workers:
            worker.pick(0, 99)  # reads the siblings' journals (the relayed picks among them)
            assert sum(worker.memory.placed(e) for e in worker.membership.endpoints()) == 9


def test_picks_of_endpoints_this_router_lacks_are_ignored() -> None:
    a, b = Replica("a"), Replica("b")
    b.follow(a)
    assert b.follower is not None
    gone = b.workers[0].membership.endpoints()[0]
    b.workers[0].membership.remove(gone.url, "test")
    for g in range(8):
        a.workers[0].pick(g)
    b.poll(a)
    on_gone = sum(1 for p in a.log.page([]).picks if p.url == gone.url)
    assert b.follower.ignored == on_gone and b.follower.applied == 8 - on_gone
    assert gone.url not in {url for url in b.workers[0].memory.holders(request(0))} or on_gone == 0


def test_a_restarted_peer_is_read_again_from_its_start() -> None:
    a, b = Replica("a"), Replica("b")
    b.follow(a)
    assert b.follower is not None
    for g in range(3):
        a.workers[0].pick(g)
    b.poll(a)
    assert b.follower.applied == 3
    reborn = Replica("a2")  # the peer restarted: a new incarnation, its journals empty
    for g in range(3, 5):
        reborn.workers[0].pick(g)
    b.poll(reborn)
    assert b.follower.applied == 5 and b.follower.restarts == 1 and b.follower.incarnation == "a2"


# -- the log's bounds --------------------------------------------------------------------------


def test_a_page_holds_at_most_its_picks_and_the_cursor_goes_on_from_there() -> None:
    a = Replica("a")
    worker = a.workers[0]
    for n in range(MAX_PAGE_PICKS + 40):
        worker.pick(n % 50, n)
    first = a.log.page([])
    assert len(first.picks) == MAX_PAGE_PICKS and first.more
    rest = a.log.page(parse_cursor(first.cursor))
    assert len(rest.picks) == 40 and not rest.more
    assert len(encode_page(first)) <= MAX_PAGE_BYTES
    assert a.log.page(parse_cursor(rest.cursor)).picks == []


def test_a_small_byte_budget_ends_the_page_early_and_a_lapped_cursor_starts_at_the_oldest_kept() -> None:
    a = Replica("a")
    worker = a.workers[0]
    for n in range(20):
        worker.pick(n, n)
    small = a.log.page([], budget=2048)
    assert 0 < len(small.picks) < 20 and small.more and len(encode_page(small)) <= 2048
    sync = worker.sync
    assert sync is not None
    for n in range(PICKS_KEPT + 10):  # lap the ring
        sync.picked(
            worker.routing.selector.policies["prefix"],
            request(n % 7),
            worker.membership.endpoints()[0],
            True,
        )
    page = a.log.page([0])
    written = 20 + PICKS_KEPT + 10
    # it skipped what the ring no longer holds, and went on from the oldest pick it does
    assert parse_cursor(page.cursor) == [written - PICKS_KEPT + len(page.picks)]


def test_a_cursor_past_what_was_written_starts_from_now() -> None:
    a = Replica("a")
    a.workers[0].pick(1)
    page = a.log.page([10_000])
    assert page.picks == [] and page.cursor == "1"


# -- a hostile peer's pages --------------------------------------------------------------------


def _good() -> dict[str, object]:
    return {
        "incarnation": "abc",
        "cursor": "3",
        "more": False,
        "urls": ["http://10.0.0.1:8000"],
        "policies": ["prefix"],
        "picks": [[0, 0, 0, [1, 2, 3]]],
    }


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"urls": "x"}, "urls"),
        ({"urls": [7]}, "urls"),
        ({"urls": ["x" * 5000]}, "urls"),
        ({"picks": [[1, 0, 0, []]]}, "url index"),
        ({"picks": [[0, 5, 0, []]]}, "policy index"),
        ({"picks": [[0, 0, -1, []]]}, "prefix epoch"),
        ({"picks": [[0, 0, 0, [True]]]}, "key"),
        ({"picks": [[0, 0, 0, ["1"]]]}, "key"),
        ({"picks": [[0, 0, 0, [1.5]]]}, "key"),
        ({"picks": [[0, 0, 0, list(range(MAX_KEYS + 1))]]}, "keys"),
        ({"picks": [[0, 0, 0]]}, "entry"),
        ({"picks": [[0, 0, 0, []]] * (MAX_PAGE_PICKS + 1)}, "picks"),
        ({"picks": {"a": 1}}, "picks"),
        ({"cursor": "1.x"}, "after"),
        ({"cursor": 7}, "cursor"),
        ({"incarnation": "<script>"}, "incarnation"),
        ({"more": "yes"}, "more"),
    ],
)
def test_a_page_that_breaks_a_bound_or_a_type_is_refused_whole(change: dict[str, object], why: str) -> None:
    with pytest.raises(PeerWireError, match=why):
        decode_page(orjson.dumps({**_good(), **change}))


def test_garbage_huge_and_deep_pages_are_refused() -> None:
    for body in (b"", b"\xff\xfe", b"[]", b"null", b"{" * 100_000, b" " * (MAX_PAGE_BYTES + 1)):
        with pytest.raises(PeerWireError):
            decode_page(body)
    with pytest.raises(PeerWireError):
        decode_page(orjson.dumps(_good())[:-1] + b',"picks":[[0,0,0,[' + b"1" * 30 + b"]]]}")


@settings(deadline=None, max_examples=200)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(list(_good())), c, max_size=6),
        max_leaves=30,
    )
)
def test_any_json_is_either_a_checked_page_or_refused(doc: object) -> None:
    try:
        page = decode_page(orjson.dumps(doc))
    except (PeerWireError, orjson.JSONEncodeError):
        return
    assert all(len(p.keys) <= MAX_KEYS and all(0 <= k < 1 << 64 for k in p.keys) for p in page.picks)


def test_a_page_of_unknown_urls_and_policies_changes_nothing() -> None:
    b, a = Replica("b"), Replica("a")
    b.follow(a)
    assert b.follower is not None
    picks = [PeerPick(f"http://203.0.113.{n}:8000", "nope", 0, (n, n + 1)) for n in range(MAX_PAGE_PICKS)]
    page = decode_page(encode_page(PeerPage("a", "9", False, picks)))
    asyncio.run(b.follower.take(page))
    worker = b.workers[0]
    assert b.follower.ignored == MAX_PAGE_PICKS and b.follower.applied == 0
    assert sum(worker.memory.placed(e) for e in worker.membership.endpoints()) == 0
    # a known url with an unknown policy: the keys are learnt, no recent pick is counted
    known: Endpoint = worker.membership.endpoints()[0]
    epoch = hash_epoch("1:0")  # the test endpoints' prefix epoch
    page = decode_page(encode_page(PeerPage("a", "10", False, [PeerPick(known.url, "nope", epoch, (5, 6))])))
    asyncio.run(b.follower.take(page))
    assert worker.memory.holds(5, known) and b.follower.applied == 1


def test_keys_of_another_prefix_epoch_are_not_learnt() -> None:
    b, a = Replica("b"), Replica("a")
    b.follow(a)
    assert b.follower is not None
    known = b.workers[0].membership.endpoints()[0]  # its supervisor's epoch is "1:0"
    page = PeerPage("a", "1", False, [PeerPick(known.url, "prefix", 12345, (7, 8))])
    asyncio.run(b.follower.take(decode_page(encode_page(page))))
    assert not b.workers[0].memory.holds(7, known) and b.follower.applied == 1
    assert MODEL


def test_a_peer_url_that_is_this_router_itself_is_not_followed() -> None:
    """One list of every replica's URL, given to each: a router's own URL answers with its own life."""
    a = Replica("a")
    worker = a.workers[0]
    assert worker.sync is not None
    policies = worker.routing.selector.policies
    follower = PeerFollower(
        "http://a", "t", worker.membership.get, worker.memory, policies, worker.sync, False, "a"
    )
    for g in range(3):
        worker.pick(g)
    more = asyncio.run(follower.take(decode_page(encode_page(a.log.page([])))))
    assert not more and follower.itself and follower.applied == 0


def test_a_peers_backlog_teaches_keys_but_counts_no_recent_picks() -> None:
    """First contact (or the peer's restart) reads its ring: history, not picks made now."""
    a, b = Replica("a"), Replica("b")
    b.follow(a)
    assert b.follower is not None
    engine = a.workers[0].membership.endpoints()[0]
    sync = a.workers[0].sync
    assert sync is not None
    prefix = a.workers[0].routing.selector.policies["prefix"]
    for n in range(MAX_PAGE_PICKS + 10):  # more than one page, all on one engine
        sync.picked(prefix, request(n % 5, n), engine, True)
    b.poll(a)
    mine = b.workers[0]
    recent = mine.routing.selector.policies["prefix"]._recent  # type: ignore[attr-defined]
    held = mine.membership.get(engine.url)
    assert held is not None and mine.memory.placed(held) == 5
    assert recent.count(engine.url, time.monotonic()) == 0.0
    sync.picked(prefix, request(0, 99), engine, True)  # a pick made now, read live
    b.poll(a)
    assert 0.9 < recent.count(engine.url, time.monotonic()) <= 1.0
