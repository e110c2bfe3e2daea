"""`corral router --workers N` pieces without a router: the CPU count a container allows, the worker
pool's exit codes and restarts (real forked processes), and the merged /metrics page."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from corral.engine.metrics_text import samples
from corral.router.telemetry.worker_pages import label_page, merge_fleets, merge_pages
from corral.router.workers import WorkerPool, WorkerSlot, cgroup_cpu_quota, cpu_limit

# -- CPUs ------------------------------------------------------------------------------------------


def test_cgroup_v2_quota_caps_the_cpu_count(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.5
    assert cpu_limit(tmp_path) == min(2, len(os.sched_getaffinity(0)))  # 1.5 CPUs: two workers


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    assert cpu_limit(tmp_path) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_limit(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(tmp_path) is None


def test_slot_ids_and_sockets(tmp_path: Path) -> None:
    slot = WorkerSlot(2, 3, tmp_path)
    assert slot.router_id("edge-1") == "edge-1/w2"
    assert slot.sibling_sockets() == {"w1": tmp_path / "w1.sock", "w3": tmp_path / "w3.sock"}


# -- the pool: real forked workers ---------------------------------------------------------------

WorkerMain = Callable[[WorkerSlot, Callable[[], None]], int]


def _until_sigterm(slot: WorkerSlot, ready: Callable[[], None]) -> int:
    """A worker that serves until the parent's SIGTERM, having asked the parent to stop."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    ready()
    os.kill(os.getppid(), signal.SIGTERM)
    signal.sigwait({signal.SIGTERM})
    return 0


def _pool(main: WorkerMain, tmp_path: Path) -> WorkerPool:
    return WorkerPool(1, main, tmp_path, shutdown_timeout=5.0)


def test_a_clean_drain_exits_0(tmp_path: Path) -> None:
    assert _pool(_until_sigterm, tmp_path).run() == 0


def test_a_first_start_that_fails_stops_the_pool_with_its_code(tmp_path: Path) -> None:
    assert _pool(lambda slot, ready: 2, tmp_path).run() == 2


def test_a_worker_that_dies_is_restarted_and_the_exit_code_says_so(tmp_path: Path) -> None:
    marker = tmp_path / "restarted"

    def dies_once(slot: WorkerSlot, ready: Callable[[], None]) -> int:
        if not slot.restarted:
            ready()
            os.kill(os.getpid(), signal.SIGKILL)
        marker.write_text(slot.name)
        return _until_sigterm(slot, ready)

    assert _pool(dies_once, tmp_path).run() == 1  # it drained cleanly, but one worker had died
    assert marker.read_text() == "w1"


def test_a_worker_that_fails_its_drain_fails_the_pool(tmp_path: Path) -> None:
    def fails_drain(slot: WorkerSlot, ready: Callable[[], None]) -> int:
        _until_sigterm(slot, ready)
        return 3

    assert _pool(fails_drain, tmp_path).run() == 1


# -- /metrics across workers ---------------------------------------------------------------------

PAGE = b"""# HELP corral_router_requests_total Requests.
# TYPE corral_router_requests_total counter
corral_router_requests_total{code="200",model="m"} 3.0
# HELP corral_router_up Up.
# TYPE corral_router_up gauge
corral_router_up 1.0
corral_router_empty{} 2.0
"""


def test_every_sample_gets_the_worker_label() -> None:
    labelled = label_page(PAGE, "w2").decode()
    found = {(s.name, tuple(sorted(s.labels.items()))) for s in samples(labelled, strict=True)}
    assert found == {
        ("corral_router_requests_total", (("code", "200"), ("model", "m"), ("worker", "w2"))),
        ("corral_router_up", (("worker", "w2"),)),
        ("corral_router_empty", (("worker", "w2"),)),
    }


def test_merged_pages_keep_each_family_together_with_one_header() -> None:
    merged = merge_pages([label_page(PAGE, "w1"), label_page(PAGE, "w2")]).decode()
    lines = merged.splitlines()
    assert lines.count("# TYPE corral_router_requests_total counter") == 1
    start = lines.index("# TYPE corral_router_requests_total counter")
    assert lines[start + 1 : start + 3] == [
        'corral_router_requests_total{worker="w1",code="200",model="m"} 3.0',
        'corral_router_requests_total{worker="w2",code="200",model="m"} 3.0',
    ]
    total = sum(s.value for s in samples(merged, ("corral_router_requests_total",), strict=True))
    assert total == 6.0


def _fleet(requests: int, ttft_counts: list[int]) -> dict[str, object]:
    traffic = {"requests": requests, "errors": 0, "ttft": {"counts": ttft_counts, "sum": 0.5}, "itl": {}}
    endpoint = {"url": "http://e1", "state": "READY", "in_flight": 1, "requests_sent": requests}
    totals = {"requests": requests, "errors": 1, "stream_failures": 0}
    return {"endpoints": [{**endpoint, "traffic": traffic}], "totals": totals}


def test_fleet_counters_are_summed_over_workers() -> None:
    merged = merge_fleets(_fleet(3, [1, 2]), [_fleet(5, [0, 4, 1])])
    (endpoint,) = merged["endpoints"]
    assert (endpoint["in_flight"], endpoint["requests_sent"], endpoint["state"]) == (2, 8, "READY")
    assert endpoint["traffic"]["requests"] == 8
    assert endpoint["traffic"]["ttft"]["counts"] == [1, 6, 1]
    assert merged["totals"] == {"requests": 8, "errors": 2, "stream_failures": 0}
