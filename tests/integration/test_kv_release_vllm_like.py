"""The KV-only release and a failed sleep, end to end against `corral sim` configured as vLLM is (no
memory figures: `--no-memory-metrics`), behind a `corral router --policy prefix`. A level-0 keep pause
with `release_kv` empties the engine's prefix cache, so its wake moves the prefix epoch: the router
forgets the prefixes it sent there, and the first request with an old prefix is a miss in vLLM's own
counter. VERIFY of the release says what it checked of the weights on an engine without figures or
NVML (vLLM's sleep-state gauge; the memory check not measured, never passed). A level-1 sleep that
fails after vLLM paused (and cleared) the scheduler comes back READY through RECOVER on a new epoch
too. Real processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from corral.engine.gpus import read_gpus
from tests.integration.test_prefix_after_sleep import (
    GROUPS,
    HITS,
    ask,
    endpoint,
    engine_figure,
    verify_evidence,
)
from tests.integration.test_supervisor_partial_wake import run_op
from tests.integration.test_supervisor_sleep_ops import DEV
from tests.integration.test_supervisor_support import Supervised, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

VLLM_LIKE = ("--enable-sleep-mode", "--no-memory-metrics", "--itl-ms", "5")

pytestmark = pytest.mark.skipif(
    read_gpus() is not None, reason="NVML answers here: the engine's memory would be measured, not missing"
)


@contextmanager
def fleet(*sim_args: str) -> Iterator[tuple[Supervised, str]]:
    sup = start_supervised(sim_args=(*VLLM_LIKE, *sim_args), sup_args=("--quiet-period", "0.2"), env=DEV)
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
        sup.wait_state("READY", 60)
        router.wait_http(router_url + "/health")
        wait_until(lambda: endpoint(router_url)["routable"], 30, "the engine routable")
        yield sup, router_url
    finally:
        router.stop()
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def fill(router_url: str, sup: Supervised) -> str:
    """Two requests per group: the router remembers each group's key, the engine hits (vLLM's counter)."""
    hits = engine_figure(sup, HITS)
    for group in range(GROUPS):
        ask(router_url, group, "When is high water?")
        ask(router_url, group, "And low water?")
    seen = endpoint(router_url)
    assert seen["prefix_memory"]["keys"] == GROUPS, seen
    assert engine_figure(sup, HITS) > hits
    return str(seen["supervisor"]["prefix_epoch"])


def forgotten(router_url: str, sup: Supervised, before_epoch: str) -> str:
    """READY on a new epoch, the router's memory for the engine empty, an old prefix a miss."""
    wait_until(
        lambda: (
            endpoint(router_url)["routable"]
            and endpoint(router_url)["supervisor"]["prefix_epoch"] != before_epoch
        ),
        30,
        "the router to see the engine READY on a new prefix epoch",
    )
    seen = endpoint(router_url)
    assert seen["prefix_memory"]["keys"] == 0, seen
    hits = engine_figure(sup, HITS)
    ask(router_url, 0, "When is high water?")
    assert engine_figure(sup, HITS) == hits
    return str(seen["supervisor"]["prefix_epoch"])


def test_a_kv_release_and_its_wake_move_the_prefix_epoch() -> None:
    with fleet() as (sup, router_url):
        epoch = fill(router_url, sup)
        slept = run_op(
            sup, "/v1/sleep", {"level": 0, "mode": "keep", "release_kv": True, "operation_id": "kv1"}
        )
        assert slept["status"] == "succeeded", slept
        checked = verify_evidence(sup, "kv1")
        assert checked["sleep_state"] is None  # vLLM's gauge names no offload and no discard
        assert checked["memory"]["outcome"] == "not_measured", checked["memory"]
        assert sup.state()["sleep"]["kv_released"] is True

        assert run_op(sup, "/v1/wake", {"operation_id": "w1"})["status"] == "succeeded"
        new_epoch = forgotten(router_url, sup, epoch)
        prefix = verify_evidence(sup, "w1")["prefix_cache"]
        assert prefix["prefix_epoch"] == new_epoch == sup.state()["prefix_cache"]["epoch"], prefix
        assert sup.state()["prefix_cache"]["last_reset"]["why"] == "wake"


def test_a_plain_level_0_pause_keeps_the_prefix_epoch() -> None:
    with fleet() as (sup, router_url):
        epoch = fill(router_url, sup)
        assert run_op(sup, "/v1/sleep", {"level": 0, "mode": "wait"})["status"] == "succeeded"
        assert run_op(sup, "/v1/wake", {"operation_id": "w0"})["status"] == "succeeded"
        assert "prefix_cache" not in verify_evidence(sup, "w0")
        wait_until(lambda: endpoint(router_url)["routable"], 30, "the engine routable again")
        seen = endpoint(router_url)
        assert seen["supervisor"]["prefix_epoch"] == epoch and seen["prefix_memory"]["keys"] == GROUPS, seen


def test_a_failed_level_1_sleep_recovers_on_a_new_prefix_epoch() -> None:
    with fleet("--fail-sleep") as (sup, router_url):
        epoch = fill(router_url, sup)
        failed = run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait", "operation_id": "s1"})
        assert failed["status"] == "failed", failed
        sup.wait_state("READY", 30)
        forgotten(router_url, sup, epoch)
        assert sup.state()["prefix_cache"]["last_reset"]["why"] == "recovery wake"
