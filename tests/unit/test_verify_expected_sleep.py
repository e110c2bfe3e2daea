"""`--expect-asleep ENGINE[=LEVEL]`: parsing, and the sleep check from captured engine views."""

from __future__ import annotations

import pytest

from corral.fleet.checks.expected_sleep import ExpectAsleepError, ExpectedAsleep, asleep_problems
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.verify import FAIL, PASS, Expectations, check_processes, check_sleep

METRICS = (
    'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} {awake}\n'
    'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} {one}\n'
    'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0\n'
)


def engine(name: str, state: str, sleeping: bool, sleep: dict[str, object] | None = None) -> EngineView:
    metrics = METRICS.replace("{awake}", "0.0" if sleeping else "1.0").replace(
        "{one}", "1.0" if sleeping else "0.0"
    )
    return EngineView(
        name,
        f"http://sup-{name}",
        f"http://engine-{name}",
        state={"state": state, "sleep": sleep, "reason": "r"},
        health=200,
        sleeping=sleeping,
        metrics=metrics,
    )


def view(*engines: EngineView) -> FleetView:
    return FleetView(FleetTarget(None, []), engines=list(engines))


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("engine-1", ExpectedAsleep("engine-1")),
        ("engine-1=2", ExpectedAsleep("engine-1", 2)),
        ("http://127.0.0.1:9000=0", ExpectedAsleep("http://127.0.0.1:9000", 0)),
    ],
)
def test_parse(spec: str, parsed: ExpectedAsleep) -> None:
    assert ExpectedAsleep.parse(spec) == parsed


@pytest.mark.parametrize("spec", ["", "=1", "engine-1=3", "engine-1=deep"])
def test_parse_refuses(spec: str) -> None:
    with pytest.raises(ExpectAsleepError):
        ExpectedAsleep.parse(spec)


def test_asleep_at_the_level_passes_and_the_processes_check_accepts_it() -> None:
    fleet = view(engine("a", "READY", False), engine("b", "SLEEPING", True, {"level": 1}))
    expect = Expectations(asleep=(ExpectedAsleep("b", 1),))
    assert check_sleep(fleet, expect).verdict == PASS
    assert check_processes(fleet, expect).verdict == PASS
    assert check_processes(fleet, Expectations()).verdict == FAIL


def test_awake_partially_woken_or_at_another_level_fails() -> None:
    awake = engine("b", "READY", False)
    assert asleep_problems(awake, ExpectedAsleep("b")) == [
        "supervisor says READY, not SLEEPING",
        "the engine reports /is_sleeping false",
    ]
    partial = engine(
        "b", "SLEEPING", True, {"level": 1, "woken_tags": ["weights"], "asleep_tags": ["kv_cache"]}
    )
    assert "partially awake" in asleep_problems(partial, ExpectedAsleep("b"))[0]
    deeper = engine("b", "SLEEPING", True, {"level": 1})
    problems = asleep_problems(deeper, ExpectedAsleep("b", 2))
    assert problems == [
        "asleep at level 1, expected level 2",
        "vllm:engine_sleep_state is weights_offloaded, expected discard_all",
    ]
    check = check_sleep(view(deeper), Expectations(asleep=(ExpectedAsleep("b", 2),)))
    assert check.verdict == FAIL and "b (expected asleep)" in check.detail
