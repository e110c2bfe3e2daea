"""`--on-startup-failure`: parsing, the rollback bundle's declaration, and the verdict on a failed start."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contracts.supervisor import SupervisorState
from corral.fleet.checks.probe import EngineView
from corral.fleet.checks.status_table import bundle_cell
from corral.supervisor.lifecycle.failure_strategy import (
    LIFECYCLE_ENDED,
    OnStartupFailure,
    StartupFailure,
    Strategy,
    StrategyError,
    Verdict,
    check_rollback_bundle,
    decide,
    parse_on_startup_failure,
)

ROLLBACK_B = OnStartupFailure(Strategy.ROLLBACK, "b")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("restart", OnStartupFailure()),
        ("stay-unready", OnStartupFailure(Strategy.STAY_UNREADY)),
        ("rollback=b", ROLLBACK_B),
        (" rollback= b ", ROLLBACK_B),
    ],
)
def test_parse_each_strategy(text: str, expected: OnStartupFailure) -> None:
    assert parse_on_startup_failure(text) == expected


def test_str_is_what_the_flag_takes() -> None:
    for text in ("restart", "stay-unready", "rollback=b"):
        assert str(parse_on_startup_failure(text)) == text


@pytest.mark.parametrize("text", ["", "retry", "stay_unready", "restart=x", "stay-unready=b", "RESTART"])
def test_unknown_values_name_the_value_and_the_choices(text: str) -> None:
    with pytest.raises(StrategyError) as caught:
        parse_on_startup_failure(text)
    assert repr(text) in str(caught.value)
    assert "restart, stay-unready or rollback=BUNDLE" in str(caught.value)


@pytest.mark.parametrize("text", ["rollback", "rollback=", "rollback=  "])
def test_rollback_without_a_bundle_says_to_name_one(text: str) -> None:
    with pytest.raises(StrategyError, match="rollback needs the bundle"):
        parse_on_startup_failure(text)


def test_rollback_bundle_must_be_declared_and_the_error_lists_the_declared() -> None:
    check_rollback_bundle(ROLLBACK_B, ["a", "b"], "initial")
    with pytest.raises(StrategyError) as caught:
        check_rollback_bundle(OnStartupFailure(Strategy.ROLLBACK, "c"), ["b", "a"], "initial")
    message = str(caught.value)
    assert "'c' is not declared" in message and "a, b" in message and "--bundle FILE" in message
    with pytest.raises(StrategyError, match="none"):
        check_rollback_bundle(ROLLBACK_B, [], "initial")


def test_rollback_to_the_bundle_the_engine_starts_with_is_refused() -> None:
    with pytest.raises(StrategyError, match="--bundle-name"):
        check_rollback_bundle(OnStartupFailure(Strategy.ROLLBACK, "initial"), ["initial", "b"], "initial")


def test_other_strategies_need_no_bundle() -> None:
    check_rollback_bundle(OnStartupFailure(), [], "initial")
    check_rollback_bundle(OnStartupFailure(Strategy.STAY_UNREADY), [], "initial")


def test_restart_gives_up() -> None:
    assert decide(OnStartupFailure(), rolled_back=False, operation=None) is Verdict.GAVE_UP


@pytest.mark.parametrize("rolled_back", [False, True])
@pytest.mark.parametrize("operation", [None, "switch_bundle op-1"])
def test_stay_unready_holds_whatever_came_before(rolled_back: bool, operation: str | None) -> None:
    choice = OnStartupFailure(Strategy.STAY_UNREADY)
    assert decide(choice, rolled_back=rolled_back, operation=operation) is Verdict.STAY_UNREADY


def test_rollback_once_then_give_up() -> None:
    assert decide(ROLLBACK_B, rolled_back=False, operation=None) is Verdict.ROLLING_BACK
    assert decide(ROLLBACK_B, rolled_back=True, operation=None) is Verdict.GAVE_UP


def test_no_rollback_under_an_operation_its_recover_decides() -> None:
    assert decide(ROLLBACK_B, rolled_back=False, operation="switch_bundle op-1") is Verdict.GAVE_UP


def test_verdicts_that_end_the_lifecycle() -> None:
    # an operation waiting on a start stops at these; rolling_back is followed by the rollback's start
    assert {Verdict(v) for v in LIFECYCLE_ENDED} == {Verdict.GAVE_UP, Verdict.STAY_UNREADY}


def test_startup_failure_json_names_the_bundle_the_verdict_and_the_rollback_target() -> None:
    body = StartupFailure("a", "engine exited with code 3", Verdict.ROLLING_BACK, ROLLBACK_B).to_json()
    assert body == {
        "bundle": "a",
        "reason": "engine exited with code 3",
        "verdict": "rolling_back",
        "strategy": "rollback=b",
        "rollback_to": "b",
    }
    held = StartupFailure("a", "r", Verdict.STAY_UNREADY, OnStartupFailure(Strategy.STAY_UNREADY))
    assert "rollback_to" not in held.to_json()


def test_status_shows_the_bundle_in_effect_and_a_strategy_other_than_restart() -> None:
    def cell(**state: Any) -> str:
        return bundle_cell(EngineView("e", None, None, state={"bundle": {"fingerprint": "f1"}, **state}))

    assert cell(bundle_name="good", on_startup_failure="restart") == "good f1"
    assert cell(bundle_name="good", on_startup_failure="rollback=good") == (
        "good f1 [on start failure: rollback=good]"
    )
    assert cell() == "f1"


def test_the_state_contract_carries_the_strategy_and_the_failed_start() -> None:
    failure = StartupFailure("a", "r", Verdict.STAY_UNREADY, OnStartupFailure(Strategy.STAY_UNREADY))
    body = {
        "state": "FAILED",
        "epoch": 3,
        "on_startup_failure": "stay-unready",
        "startup_failure": failure.to_json(),
    }
    state = SupervisorState.model_validate(body)
    assert state.on_startup_failure == "stay-unready" and state.startup_failure == failure.to_json()
    assert SupervisorState.model_validate({"state": "READY", "epoch": 1}).on_startup_failure is None
