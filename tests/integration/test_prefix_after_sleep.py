"""Prefix state after sleep and reload, end to end: a `corral router --policy prefix` in front of a supervised
`corral sim`. Prefixed traffic fills the router's prefix memory for the engine and the engine's prefix cache;
a level-1 sleep and wake through the supervisor then leaves the router's memory for that engine empty (its
/v1/fleet), the engine's cache reset since before the sleep (VERIFY's evidence, the sim's figures), and the
first request with an old prefix a miss. A reload does the same. Real processes on loopback."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.test_supervisor_partial_wake import run_op
from tests.integration.test_supervisor_sleep_ops import DEV, SIM_ARGS
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.prom import sample, scrape
from tests.support.waits import wait_until

SYSTEM = "You answer questions about tide tables and harbour charts, briefly and exactly. " * 12
GROUPS = 4
HITS = "vllm:prefix_cache_hits_total"
BLOCKS = "corral_sim_prefix_cache_blocks"
RESETS = "corral_sim_prefix_cache_resets_total"


def ask(router_url: str, group: int, question: str) -> None:
    body = {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": f"Group {group}. {SYSTEM}"},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
    }
    resp = httpx.post(router_url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text


def endpoint(router_url: str) -> dict[str, Any]:
    (only,) = http_json(router_url + "/v1/fleet")[1]["endpoints"]
    return only


def engine_figure(sup: Supervised, name: str) -> float:
    value = sample(scrape(sup.engine_url + "/metrics"), name)
    assert value is not None, name
    return value


def verify_evidence(sup: Supervised, op_id: str) -> dict[str, Any]:
    (record,) = [
        r
        for r in sup.oplog()
        if r["record"] == "runbook_step" and r["operation_id"] == op_id and r["step"] == "verify"
    ]
    return record["evidence"]


def fill(router_url: str, sup: Supervised) -> str:
    """Two requests per group: the router remembers every group's key, the engine caches and hits."""
    hits = engine_figure(sup, HITS)
    for group in range(GROUPS):
        ask(router_url, group, "When is high water?")
        ask(router_url, group, "And low water?")
    seen = endpoint(router_url)
    assert seen["prefix_memory"]["keys"] == GROUPS, seen
    assert engine_figure(sup, BLOCKS) > 0
    assert engine_figure(sup, HITS) > hits  # the second request of each group hit the first's blocks
    epoch = seen["supervisor"]["prefix_epoch"]
    assert epoch and seen["prefix_memory"]["prefix_epoch"] == epoch
    return str(epoch)


def forgotten_after(router_url: str, sup: Supervised, op_id: str, before_epoch: str, resets: float) -> None:
    """The router's memory for the engine is empty on a new epoch; the engine's cache was reset since
    before the operation; the first request with an old prefix misses."""
    wait_until(
        lambda: (
            endpoint(router_url)["routable"]
            and endpoint(router_url)["supervisor"]["prefix_epoch"] != before_epoch
        ),
        15,
        "the router to see the engine READY on a new prefix epoch",
    )
    seen = endpoint(router_url)
    assert seen["prefix_memory"]["keys"] == 0, seen
    prefix = verify_evidence(sup, op_id)["prefix_cache"]
    assert prefix["check"]["outcome"] == "passed", prefix
    assert prefix["reset"] == "done" and prefix["prefix_epoch"] == seen["supervisor"]["prefix_epoch"]
    assert engine_figure(sup, RESETS) > resets
    assert sup.state()["prefix_cache"]["epoch"] == seen["supervisor"]["prefix_epoch"]
    hits = engine_figure(sup, HITS)
    ask(router_url, 0, "When is high water?")  # asked before the operation: its blocks are gone
    assert engine_figure(sup, HITS) == hits
    assert endpoint(router_url)["prefix_memory"]["keys"] == 1


def test_sleep_level_1_and_wake_forget_the_engines_prefixes_in_router_and_engine() -> None:
    sup = start_supervised(sim_args=SIM_ARGS, sup_args=("--quiet-period", "0.2"), env=DEV)
    port = free_port()
    router = CorralProcess(
        [
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "prefix",
            "--supervisor-heartbeat",
            "0.5",
            "--supervised",
            f"{sup.engine_url}={sup.url}",
        ]
    )
    router_url = f"http://127.0.0.1:{port}"
    try:
        sup.wait_state("READY", 30)
        router.wait_http(router_url + "/health")
        wait_until(lambda: endpoint(router_url)["routable"], 15, "the engine routable")

        epoch = fill(router_url, sup)
        resets = engine_figure(sup, RESETS)
        assert (
            run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": "s1"})["status"]
            == "succeeded"
        )
        assert not endpoint(router_url)["routable"]
        assert run_op(sup, "/v1/wake", {"operation_id": "w1"})["status"] == "succeeded"
        forgotten_after(router_url, sup, "w1", epoch, resets)

        epoch = fill(router_url, sup)
        resets = engine_figure(sup, RESETS)
        assert run_op(sup, "/v1/reload", {"operation_id": "r1"})["status"] == "succeeded"
        forgotten_after(router_url, sup, "r1", epoch, resets)
    finally:
        router.stop()
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
