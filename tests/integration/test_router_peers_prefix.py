"""Two router replicas that share their picks (`--peer` each other, issue 28) route as one: requests of
a few prompt groups, split between the two routers in turn, keep each group on one engine, whichever
router placed it. Without `--peer` the same split puts groups on two engines (each replica places a
prefix it has not seen itself). Which engine served a request is read from the simulators' own
prefix-cache counters, not from the routers; the peered routers' own /v1/fleet says when a pick has
reached the other one (a condition waited for, not a time)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_router_passthrough import SIM_ARGS
from tests.integration.test_router_prefix import cache_counters
from tests.support.prefix_routers import (
    ask,
    prefix_router_args,
    served_by_worker,
    start_peered_routers,
    until_serving,
)
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import wait_until

GROUPS = 7
ROUNDS = 4


def fleet(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        return dict(json.loads(resp.read()))


def applied_from_peer(url: str) -> int:
    """The picks of its peer the router has applied; -1 when a worker that does not follow the peers
    answered (with --workers N, worker 1 follows them: ask again, on a new connection)."""
    following = fleet(url)["peers"]["following"]
    return int(following[0]["applied"]) if following else -1


def following_of(url: str) -> dict[str, Any]:
    """The router's follower of its peer, as worker 1 (the one that follows) tells it."""
    found: list[dict[str, Any]] = []

    def worker_1_answered() -> bool:
        following = fleet(url)["peers"]["following"]
        found[:] = following or []
        return bool(found)

    wait_until(worker_1_answered, 10.0, "worker 1 to answer /v1/fleet")
    return found[0]


def split_between_routers(engines: list[str], urls: list[str], peered: bool) -> dict[int, list[str]]:
    """Each group's requests, sent to the two routers in turn: the engines that served each group."""
    placed: dict[int, list[str]] = {g: [] for g in range(GROUPS)}
    sent = [0, 0]
    before = [cache_counters(e)[0] for e in engines]
    for turn in range(ROUNDS):
        for group in range(GROUPS):
            which = (group + turn) % 2
            ask(urls[which], group, turn)
            sent[which] += 1
            moved: list[str] = []

            def one_moved(previous: list[float] = before, found: list[str] = moved) -> bool:
                now = [cache_counters(e)[0] for e in engines]
                found[:] = [e for e, a, b in zip(engines, previous, now, strict=True) if b > a]
                previous[:] = now
                return bool(found)

            wait_until(one_moved, 10.0, "an engine's prefix-cache queries to move")
            assert len(moved) == 1, moved
            placed[group].append(moved[0])
            if peered:  # the other router has applied every pick this one made
                other, count = urls[1 - which], sent[which]
                wait_until(
                    lambda other=other, count=count: applied_from_peer(other) >= count,  # type: ignore[misc]
                    10.0,
                    "the pick to reach the peer",
                )
    return placed


@pytest.mark.parametrize(
    ("peered", "workers"),
    [(True, (1, 1)), (True, (2, 1)), (False, (1, 1))],
    ids=["peered", "peered-one-with-2-workers", "not-peered"],
)
def test_two_replicas_keep_each_prompt_group_on_one_engine_only_when_peered(
    tmp_path: Path, peered: bool, workers: tuple[int, int]
) -> None:
    token = tmp_path / "peer.token"
    token.write_text("a-shared-secret-for-the-test\n")
    args = (*SIM_ARGS[:-2], "--max-model-len", "2048")
    sims = [start_sim(None, *args) for _ in range(3)]
    engines = [url for _, url in sims]
    routers = start_peered_routers(engines, token if peered else None, workers)
    urls = [url for _, url in routers]
    try:
        placed = split_between_routers(engines, urls, peered)
        split = {g: sorted(set(where)) for g, where in placed.items() if len(set(where)) > 1}
        if peered:
            assert not split, f"groups served by more than one engine: {split}"
            # new groups dealt over the engines, not piled on one (how evenly is the engines' load
            # scrapes' to say, and varies from run to run for one router too)
            assert len({where[0] for where in placed.values()}) > 1, placed
            for url in urls:
                following = following_of(url)
                # (the router started first may have asked its peer once before that one listened)
                assert following["up"] and following["ignored"] == 0, following
            if workers[0] == 2:  # both workers placed some of router 0's share
                served = served_by_worker(urls[0])
                assert set(served) == {"w1", "w2"} and min(served.values()) >= 2, served
        else:  # today's replicas: each places what it has not seen itself
            assert split, f"every group stayed on one engine without peers: {placed}"
    finally:
        for proc, _ in routers:
            proc.stop()
        for proc, _ in sims:
            proc.stop()


def test_the_peer_route_needs_the_token_and_says_nothing_without_it(tmp_path: Path) -> None:
    token = tmp_path / "peer.token"
    token.write_text("the-right-secret\n")
    sim, engine = start_sim(None, *SIM_ARGS)
    routers = start_peered_routers([engine], token)
    url = routers[0][1]
    try:
        ask(url, 0, 0)
        wait_until(lambda: applied_from_peer(routers[1][1]) >= 1, 10.0, "the pick to reach the peer")
        route = url + "/internal/peer-picks?after="
        for headers, status in (
            ({}, 401),
            ({"Authorization": "Bearer the-wrong-secret"}, 403),
            ({"Authorization": "Basic dGhlLXJpZ2h0LXNlY3JldA=="}, 401),
            ({"Authorization": "Bearer the-right-secret", "Origin": "http://evil.example"}, 403),
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(route, headers=headers), timeout=2.0)
            assert refused.value.code == status, headers
            body = refused.value.read().decode()
            assert engine not in body and "picks" not in json.loads(body), body
        good = urllib.request.Request(route, headers={"Authorization": "Bearer the-right-secret"})
        with urllib.request.urlopen(good, timeout=2.0) as resp:
            page = json.loads(resp.read())
        assert page["urls"] == [engine] and len(page["picks"]) >= 1
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(
                urllib.request.Request(
                    url + "/internal/peer-picks?after=1;DROP",
                    headers={"Authorization": "Bearer the-right-secret"},
                ),
                timeout=2.0,
            )
        assert bad.value.code == 400
        # the log is the contract here: no secret ever reaches it
        assert "the-right-secret" not in routers[0][0].output() + routers[1][0].output()
    finally:
        for proc, _ in routers:
            proc.stop()
        sim.stop()


def test_a_router_given_its_own_url_as_a_peer_stops_asking_itself(tmp_path: Path) -> None:
    """One list of every replica's URL, given to each replica (a headless service's names)."""
    token = tmp_path / "peer.token"
    token.write_text("secret")
    sim, engine = start_sim(None, *SIM_ARGS)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = CorralProcess(prefix_router_args(port, [engine], peers=[url], token=token))
    try:
        until_serving(router, url, 1)
        ask(url, 0, 0)
        wait_until(lambda: bool(following_of(url)["itself"]), 10.0, "the router to know itself")
        assert following_of(url)["applied"] == 0
    finally:
        router.stop()
        sim.stop()
