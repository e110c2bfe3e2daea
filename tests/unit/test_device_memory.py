"""The engine's memory as VERIFY reads it on a GPU host: the process tree NVML is asked about (a real
tree: a child and a grandchild), and the decisions over two readings — a sleep freed each GPU down to
the residue, a KV release freed the KV share, a wake came back within the tolerance — with
"not measured" (never "passed") where nothing could be read."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from corral.engine.dev_api import EngineFigures
from corral.engine.gpus import GpuDevice
from corral.engine.kv_log import EngineLogFigures
from corral.supervisor.lifecycle.device_memory import (
    GIB,
    NVML,
    DeviceReading,
    engine_pids,
    read_device_sync,
    visible_devices,
)
from corral.supervisor.lifecycle.memory_checks import (
    ENGINE_METRICS,
    FAILED,
    NOT_MEASURED,
    PASSED,
    MemoryRecord,
    MemoryThresholds,
    budget_evidence,
    capacity_at_ready,
    resident_verdict,
    sleep_verdict,
    wake_verdict,
)

GPU0, GPU1 = "GPU-0aaaaaaa-1111", "GPU-1bbbbbbb-2222"
TH = MemoryThresholds(sleep_residue_bytes=int(1.0 * GIB), wake_tolerance=0.05)


def reading(**gpus: float) -> DeviceReading:
    names = {"g0": GPU0, "g1": GPU1}
    return DeviceReading({names[k]: int(v * GIB) for k, v in gpus.items()}, (100, 101))


def logged(weights_gib: float | None = 2.0, kv_gib: float | None = 30.0) -> EngineLogFigures:
    figures = EngineLogFigures()
    figures.weights_bytes = int(weights_gib * GIB) if weights_gib is not None else None
    figures.kv_cache_bytes = int(kv_gib * GIB) if kv_gib is not None else None
    return figures


# -- the process tree -----------------------------------------------------------------------------

TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def engine_tree() -> Iterator[tuple[int, int, int]]:
    """A process (the 'API server') whose child (the 'EngineCore') has a child (a 'worker')."""
    top = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {TREE!r}])\np.wait()",
        ],
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            children = psutil.Process(top.pid).children(recursive=True)
            if len(children) >= 2:
                break
            time.sleep(0.05)
        children = psutil.Process(top.pid).children(recursive=True)
        assert len(children) >= 2, "the child and grandchild did not start"
        child = next(c for c in children if c.ppid() == top.pid)
        grandchild = next(c for c in children if c.ppid() == child.pid)
        yield top.pid, child.pid, grandchild.pid
    finally:
        for proc in psutil.Process(top.pid).children(recursive=True):
            proc.kill()
        top.kill()
        top.wait()


def test_the_tree_is_the_engine_and_every_descendant(engine_tree: tuple[int, int, int]) -> None:
    top, child, grandchild = engine_tree
    assert sorted(engine_pids(top)) == sorted([top, child, grandchild])
    assert sorted(engine_pids(child)) == sorted([child, grandchild])  # not the parent


def test_a_gone_process_has_no_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert engine_pids(proc.pid) == []
    assert read_device_sync(proc.pid, processes=lambda: {GPU0: {proc.pid: GIB}}) is None


def test_the_engines_share_is_what_its_whole_tree_holds(engine_tree: tuple[int, int, int]) -> None:
    top, child, grandchild = engine_tree
    me = psutil.Process().pid  # another process NVML lists, that exists here and is no engine's
    listed = {GPU0: {child: 3 * GIB, grandchild: 2 * GIB, me: 7 * GIB}, GPU1: {me: GIB}}
    got = read_device_sync(top, processes=lambda: listed, devices=lambda: [])
    assert got is not None and got.gpus == {GPU0: 5 * GIB} and got.scope == "process"
    assert sorted(got.pids) == sorted([top, child, grandchild])


def test_a_rank_that_left_the_tree_still_counts(engine_tree: tuple[int, int, int]) -> None:
    """A rank seen before that was reparented (its parent died) is no descendant any more."""
    _, child, grandchild = engine_tree
    outside = psutil.Process().pid  # stands for the reparented rank: alive, not under `child`
    listed = {GPU0: {grandchild: 2 * GIB, outside: 3 * GIB}}
    without = read_device_sync(child, processes=lambda: listed, devices=lambda: [])
    assert without is not None and without.gpus == {GPU0: 2 * GIB}
    got = read_device_sync(child, processes=lambda: listed, devices=lambda: [], also=[outside, 4_000_000])
    assert got is not None and got.gpus == {GPU0: 5 * GIB} and 4_000_000 not in got.pids


def test_nothing_of_the_engines_listed_is_an_empty_reading_not_the_gpus_use(
    engine_tree: tuple[int, int, int],
) -> None:
    """A CPU engine on a GPU host: NVML lists processes of this namespace, none of the engine's."""
    me = psutil.Process().pid
    got = read_device_sync(
        engine_tree[0], processes=lambda: {GPU0: {me: GIB}}, devices=lambda: [gpu(0, GPU0, 80, 70)]
    )
    assert got is not None and got.gpus == {} and got.scope == "process"


def gpu(index: int, uuid: str, total_gib: float, free_gib: float) -> GpuDevice:
    return GpuDevice(index, uuid, "H200", int(total_gib * GIB), int(free_gib * GIB))


def test_in_another_pid_namespace_the_engines_gpus_are_read_whole(engine_tree: tuple[int, int, int]) -> None:
    """NVML lists PIDs that do not exist here (the host's, seen from a container): the reading is the
    memory used on the GPUs the engine sees (CUDA_VISIBLE_DEVICES), marked as whole-GPU."""
    foreign = 4_000_000  # above any pid_max: no process here has it
    listed = {GPU0: {foreign: 30 * GIB}, GPU1: {foreign + 1: 9 * GIB}}
    gpus = [gpu(0, GPU0, 141, 100), gpu(1, GPU1, 141, 130)]
    everything = read_device_sync(engine_tree[0], None, lambda: listed, lambda: gpus)
    assert everything is not None and everything.scope == "device"
    assert everything.gpus == {GPU0: 41 * GIB, GPU1: 11 * GIB}
    only_one = read_device_sync(
        engine_tree[0], visible_devices({"CUDA_VISIBLE_DEVICES": "1"}), lambda: listed, lambda: gpus
    )
    assert only_one is not None and only_one.gpus == {GPU1: 11 * GIB}
    by_uuid = read_device_sync(engine_tree[0], {GPU0[:10]}, lambda: listed, lambda: gpus)
    assert by_uuid is not None and list(by_uuid.gpus) == [GPU0]
    verdict = sleep_verdict(everything, everything, 1, False, None, TH)
    assert verdict.outcome == FAILED and "whole GPUs" in verdict.reason


def test_without_nvml_or_an_engine_nothing_is_read() -> None:
    assert read_device_sync(None, processes=lambda: {GPU0: {}}) is None
    assert read_device_sync(psutil.Process().pid, processes=lambda: None) is None
    assert visible_devices({}) is None


def test_a_reading_round_trips_through_the_sleep_status() -> None:
    one = reading(g0=40, g1=40)
    assert DeviceReading.from_json(one.to_json()) == one
    assert one.to_json()["source"] == NVML
    assert DeviceReading.from_json(None) is None


# -- sleep ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [1, 2])
def test_a_sleep_that_freed_down_to_the_residue_passes(level: int) -> None:
    verdict = sleep_verdict(reading(g0=40, g1=40), reading(g0=0.6, g1=0.7), level, False, None, TH)
    assert (verdict.outcome, verdict.source) == (PASSED, NVML)
    assert verdict.to_json()["after"]["gpus"][GPU1] == int(0.7 * GIB)


def test_a_sleep_that_freed_nothing_fails_naming_the_gpu() -> None:
    verdict = sleep_verdict(reading(g0=40, g1=40), reading(g0=0.6, g1=39.5), 1, False, None, TH)
    assert verdict.outcome == FAILED
    assert GPU1[:12] in verdict.reason and GPU0[:12] not in verdict.reason
    assert "1.00 GiB residue (--sleep-residue-gib)" in verdict.reason


def test_the_residue_is_a_threshold_that_can_be_raised() -> None:
    after = reading(g0=1.5)
    assert sleep_verdict(reading(g0=40), after, 1, False, None, TH).outcome == FAILED
    raised = MemoryThresholds(sleep_residue_bytes=2 * GIB)
    assert sleep_verdict(reading(g0=40), after, 1, False, None, raised).outcome == PASSED


def test_a_kv_release_must_free_the_logged_kv_share() -> None:
    before = reading(g0=40)
    assert sleep_verdict(before, reading(g0=10), 0, True, logged(kv_gib=30), TH).outcome == PASSED
    kept = sleep_verdict(before, reading(g0=39), 0, True, logged(kv_gib=30), TH)
    assert kept.outcome == FAILED and "not released" in kept.reason


def test_a_kv_release_that_freed_more_than_the_kv_share_lost_the_weights() -> None:
    """A backend without selective KV discard frees everything: each GPU must keep all but the KV share."""
    before, shares = reading(g0=40, g1=40), logged(weights_gib=8, kv_gib=30)
    fine = sleep_verdict(before, reading(g0=10, g1=10.5), 0, True, shares, TH)
    assert fine.outcome == PASSED and "weights stayed" in fine.reason
    lost = sleep_verdict(before, reading(g0=10, g1=1.5), 0, True, shares, TH)
    assert lost.outcome == FAILED and "keep the weights resident" in lost.reason, lost.reason
    assert GPU1[:12] in lost.reason and GPU0[:12] not in lost.reason


def test_a_kv_release_without_the_kv_share_is_not_measured() -> None:
    verdict = sleep_verdict(reading(g0=40), reading(g0=10), 0, True, logged(kv_gib=None), TH)
    assert verdict.outcome == NOT_MEASURED and "Available KV cache memory" in verdict.reason


def test_a_level_0_pause_keeps_everything_resident() -> None:
    assert sleep_verdict(reading(g0=40), reading(g0=40), 0, False, None, TH).outcome == PASSED
    assert sleep_verdict(reading(g0=40), reading(g0=20), 0, False, None, TH).outcome == FAILED


def test_nothing_attributed_to_the_engine_is_not_measured() -> None:
    verdict = sleep_verdict(reading(), reading(), 1, False, None, TH)
    assert verdict.outcome == NOT_MEASURED and "a CPU engine?" in verdict.reason


# -- wake -------------------------------------------------------------------------------------------


def test_a_wake_back_within_the_tolerance_passes_and_below_it_fails() -> None:
    before = reading(g0=40, g1=40)
    assert wake_verdict(before, reading(g0=39, g1=40.5), [], None, TH).outcome == PASSED
    short = wake_verdict(before, reading(g0=30, g1=40), [], None, TH)
    assert short.outcome == FAILED and GPU0[:12] in short.reason and "--wake-tolerance" in short.reason


def test_a_partial_wake_has_the_woken_share_back_and_the_rest_still_freed() -> None:
    before, shares = reading(g0=40), logged(weights_gib=8, kv_gib=30)
    assert wake_verdict(before, reading(g0=10), ["kv_cache"], shares, TH).outcome == PASSED
    everything = wake_verdict(before, reading(g0=40), ["kv_cache"], shares, TH)
    assert everything.outcome == FAILED and "should still be freed" in everything.reason
    nothing = wake_verdict(before, reading(g0=1), ["kv_cache"], shares, TH)
    assert nothing.outcome == FAILED and "below" in nothing.reason


def test_a_partial_wake_without_the_shares_is_not_measured() -> None:
    verdict = wake_verdict(reading(g0=40), reading(g0=10), ["kv_cache"], logged(kv_gib=None), TH)
    assert verdict.outcome == NOT_MEASURED


# -- at READY, and what /v1/state shows ---------------------------------------------------------------


def test_at_ready_the_engines_figures_win_then_nvml_then_not_measured() -> None:
    figures = EngineFigures("awake", 2.0 * GIB, 4.0 * GIB, 0.0, 1.0)
    assert resident_verdict(figures, None).source == ENGINE_METRICS
    no_figures = EngineFigures(None, None, None, None, None)
    assert resident_verdict(no_figures, reading(g0=40)).source == NVML
    unmeasured = resident_verdict(no_figures, None)
    assert unmeasured.outcome == NOT_MEASURED and unmeasured.source is None


def test_the_budget_is_read_from_the_precheck_report() -> None:
    report = {
        "checks": [
            {"name": "artifact_identity", "evidence": {}},
            {"name": "memory_budget", "evidence": {"expected_kv_tokens": 100_000, "min_kv_tokens": 4096}},
        ]
    }
    figures = EngineLogFigures()
    figures.note("GPU KV cache size: 50,000 tokens")
    capacity = capacity_at_ready(figures, budget_evidence(report), TH)
    assert capacity.shortfall and capacity.expected_tokens == 100_000
    assert budget_evidence(None) is None
    assert capacity_at_ready(figures, budget_evidence({"checks": []}), TH).outcome == NOT_MEASURED


def test_the_record_keeps_the_last_verdict_and_the_capacity() -> None:
    record = MemoryRecord()
    assert record.to_json() == {"last": None, "kv_capacity": None, "logged": None}
    record.note("sleep", sleep_verdict(reading(g0=40), reading(g0=0.5), 1, False, None, TH))
    body = record.to_json()
    assert body["last"]["operation"] == "sleep" and body["last"]["outcome"] == PASSED
