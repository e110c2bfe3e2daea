"""`corral router --workers 2` as real processes: both workers serve the one port (each client
connection lands on one of them), /metrics answers for both whichever worker a scrape reaches, a killed
worker is restarted while the other keeps serving, and each worker is a router of its own in the
supervisors' acknowledgements: a drain waits for both, and a restarted worker resubscribes as itself."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable

import psutil

from corral.engine.metrics_text import samples
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port, start_sim

BODY = json.dumps({"model": "sim-model", "prompt": "hello workers", "max_tokens": 2}).encode()


def start_router(*args: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(["router", "--workers", "2", "--host", "127.0.0.1", "--port", str(port), *args])
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


def complete(router: str) -> int:
    """One completion on a connection of its own (urllib opens one per request)."""
    request = urllib.request.Request(
        router + "/v1/completions", data=BODY, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()
        return int(resp.status)


def served_by_worker(router: str) -> dict[str, float]:
    """Requests each worker answered, from one scrape of /metrics (whichever worker it reached)."""
    with urllib.request.urlopen(router + "/metrics", timeout=10) as resp:
        page = resp.read().decode()
    up = {s.labels["worker"]: s.value for s in samples(page, ("corral_router_worker_up",), strict=True)}
    assert up == {"w1": 1.0, "w2": 1.0}, up
    served: dict[str, float] = {}
    for sample in samples(page, ("corral_router_requests_total",), strict=True):
        worker = sample.labels["worker"]
        served[worker] = served.get(worker, 0.0) + sample.value
    return served


def workers_of(proc: CorralProcess) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children()


def wait_until(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {within}s")


def listening(worker: psutil.Process, port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in worker.net_connections("tcp"))


def kill_one_worker(router: CorralProcess, url: str) -> list[int]:
    """SIGKILL one worker; return once the parent's replacement for it listens on the port, with the
    statuses of the requests sent meanwhile (one per poll)."""
    before = workers_of(router)
    assert len(before) == 2, before
    victim = before[0]
    victim.kill()
    victim.wait(10)
    port = int(url.rsplit(":", 1)[1])

    statuses: list[int] = []

    def replaced() -> bool:
        statuses.append(complete(url))
        now = [p for p in workers_of(router) if p.pid != before[1].pid]
        return len(now) == 1 and now[0].pid != victim.pid and listening(now[0], port)

    wait_until(replaced, 15, "a worker restarted in place of the killed one and listening")
    return statuses


def test_two_workers_serve_one_port_and_a_killed_worker_is_restarted() -> None:
    sims = [start_sim() for _ in range(2)]
    router, url = start_router(*(arg for _, sim in sims for arg in ("--backend", sim)))
    try:
        assert [complete(url) for _ in range(40)] == [200] * 40
        served = served_by_worker(url)
        assert served.keys() == {"w1", "w2"} and all(n > 0 for n in served.values()), served
        assert sum(served.values()) == 40
        for _ in range(4):  # each request on a connection of its own: the workers answer in turn
            status, fleet = http_json(url + "/v1/fleet")
            assert status == 200 and fleet["worker"]["of"] == 2
            assert fleet["router_id"].endswith("/" + fleet["worker"]["name"]), fleet["router_id"]
            # counters are the router's, whichever worker answered: both workers' added up
            assert fleet["worker"]["counters_from"] == ["w1", "w2"], fleet["worker"]
            assert sum(e["requests_sent"] for e in fleet["endpoints"]) == 40
            assert sum(e["traffic"]["requests"] for e in fleet["endpoints"]) == 40
            assert fleet["totals"]["requests"] == 40

        during = kill_one_worker(router, url)
        assert during and during == [200] * len(during), during  # the survivor served the restart through
        # the replacement listens and serves (its counters start from zero), and so does the survivor
        assert [complete(url) for _ in range(40)] == [200] * 40
        served = served_by_worker(url)
        assert served.keys() == {"w1", "w2"} and all(n > 0 for n in served.values()), served
        assert sum(served.values()) < 80 + len(during), served  # the dead worker's counts went with it

        router.signal(signal.SIGTERM)
        assert router.wait_exit(30) == 1, router.output()[-3000:]  # drained, but a worker had died
        # the log line is the contract: the operator's notice of what happened
        assert "router worker w" in router.output() and "restarting it" in router.output()
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()


DRAIN_ARGS = ("--propagation-timeout", "10", "--quiet-period", "0.2", "--drain-timeout", "15")


def subscribed(sup: Supervised) -> dict[str, int]:
    return dict(sup.state()["routers"]["subscribed"])


def test_a_drain_waits_for_both_workers_and_a_restarted_worker_resubscribes_as_itself() -> None:
    sups = [start_supervised(sim_args=("--seed", str(i)), sup_args=DRAIN_ARGS) for i in range(2)]
    router: CorralProcess | None = None
    try:
        for sup in sups:
            sup.wait_state("READY", 30)
        pairs = [arg for sup in sups for arg in ("--supervised", f"{sup.engine_url}={sup.url}")]
        router, url = start_router("--router-id", "edge", "--supervisor-heartbeat", "0.5", *pairs)
        victim = sups[0]
        both = {"edge/w1": 1, "edge/w2": 1}
        wait_until(lambda: subscribed(victim) == both, 15, "both workers subscribed")

        kill_one_worker(router, url)
        # the dead worker's stream closed: it is not counted twice, nor awaited, once its replacement is back
        wait_until(lambda: subscribed(victim) == both, 15, "the restarted worker subscribed as itself")
        records = [r["record"] for r in victim.oplog() if r["record"].startswith("router_")]
        assert records[-2:] == ["router_unsubscribed", "router_subscribed"], records

        status, op = http_json(victim.url + "/v1/drain", "POST", {})
        assert status == 202, op
        report = victim.wait_for("drained", lambda b: b.get("drain") is not None, 40)["drain"]
        assert {a["router_id"] for a in report["routers_acknowledged"]} == set(both), report
        assert report["routers_missing"] == [] and report["routers_gone"] == [], report
        assert complete(url) == 200  # the other engine serves on
    finally:
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
