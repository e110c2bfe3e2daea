"""`corral verify`'s memory and kv_capacity checks and `corral doctor`'s sleep branches over the
supervisors' memory verdicts: failed fails, not_measured is NOT MEASURED (a failure only with
--require-measured, never a pass), passed passes; a sleep whose VERIFY found the device's memory held
is doctor's memory/not-released even without engine figures."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.fleet.checks.doctor import diagnose_engine
from corral.fleet.checks.doctor_sleep import MEMORY_NOT_RELEASED
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.verify import (
    FAIL,
    NOT_MEASURED,
    PASS,
    WARN,
    Expectations,
    check_kv_capacity,
    check_memory,
)


def verdict(operation: str, outcome: str, reason: str = "why", source: str | None = "nvml") -> dict[str, Any]:
    return {"operation": operation, "outcome": outcome, "reason": reason, "source": source}


def engine(
    name: str, last: dict[str, Any] | None, capacity: dict[str, Any] | None = None, **kw: Any
) -> EngineView:
    state = {"state": kw.pop("lifecycle", "READY"), "memory": {"last": last, "kv_capacity": capacity}}
    return EngineView(name, f"http://{name}-sup", f"http://{name}", state=state, health=200, **kw)


def view(*engines: EngineView) -> FleetView:
    return FleetView(target=FleetTarget(router=None, supervisors=()), engines=list(engines))


def test_passed_everywhere_passes() -> None:
    got = check_memory(
        view(engine("e0", verdict("wake", "passed")), engine("e1", verdict("startup", "passed"))),
        Expectations(),
    )
    assert got.verdict == PASS and "e0 wake (nvml)" in got.detail


def test_not_measured_is_its_own_verdict_and_fails_only_when_required() -> None:
    fleet = view(
        engine("e0", verdict("sleep", "not_measured", "no NVML", None)),
        engine("e1", verdict("wake", "passed")),
    )
    got = check_memory(fleet, Expectations())
    assert got.verdict == NOT_MEASURED and "e0 sleep: no NVML" in got.detail and "e1 wake" in got.detail
    assert check_memory(fleet, Expectations(require_measured=True)).verdict == FAIL


def test_a_failed_verdict_fails_and_names_the_engine() -> None:
    got = check_memory(
        view(engine("e0", verdict("sleep", "failed", "left 30 GiB")), engine("e1", None)), Expectations()
    )
    assert got.verdict == FAIL and "e0 sleep: left 30 GiB" in got.detail


def test_a_supervisor_without_a_verdict_is_not_measured_and_no_supervisor_warns() -> None:
    assert check_memory(view(engine("e0", None)), Expectations()).verdict == NOT_MEASURED
    bare = EngineView("e0", None, "http://e0", health=200)
    assert check_memory(view(bare), Expectations()).verdict == WARN


def test_kv_capacity_from_each_supervisor() -> None:
    short = {"outcome": "failed", "reason": "20% below the budget"}
    fine = {"outcome": "passed", "reason": "within 10%"}
    unknown = {"outcome": "not_measured", "reason": "no budget"}
    assert check_kv_capacity(view(engine("e0", None, fine)), Expectations()).verdict == PASS
    assert (
        check_kv_capacity(view(engine("e0", None, fine), engine("e1", None, short)), Expectations()).verdict
        == FAIL
    )
    assert check_kv_capacity(view(engine("e0", None, unknown)), Expectations()).verdict == NOT_MEASURED


def test_doctor_names_a_sleep_whose_device_memory_stayed_held() -> None:
    asleep = dict(lifecycle="SLEEPING", sleeping=True, models=[{"id": "m"}], metrics="")
    held = engine("e0", verdict("sleep", "failed", "sleep level 1 left GPU-0aaa 30.00 GiB held"), **asleep)
    found = asyncio.run(diagnose_engine(held, 0.1))
    assert found.branch == MEMORY_NOT_RELEASED and "30.00 GiB" in found.evidence
    unmeasured = engine("e0", verdict("sleep", "not_measured", "no NVML here", None), **asleep)
    found = asyncio.run(diagnose_engine(unmeasured, 0.1))
    assert found.branch == "not-ready/sleeping" and "GPU memory not measured (no NVML here)" in found.evidence


def test_an_explained_kv_shortfall_passes_with_its_explanation() -> None:
    short = {"outcome": "failed", "reason": "20% below the budget"}
    explained = Expectations(explained={"kv_shortfall": "headroom declared 0"})
    got = check_kv_capacity(view(engine("e0", None, short)), explained)
    assert got.verdict == PASS and "explained: headroom declared 0" in got.detail
