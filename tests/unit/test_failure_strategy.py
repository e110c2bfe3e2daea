"""`--on-startup-failure`: parsing, the rollback bundle's declaration, and the verdict on a failed start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.contracts.supervisor import SupervisorState
from corral.fleet.checks.probe import EngineView
from corral.fleet.checks.status_table import bundle_cell
from corral.supervisor.lifecycle.config import SupervisorConfig
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
from corral.supervisor.lifecycle.states import EngineState, StartingPhase
from corral.supervisor.lifecycle.supervisor import EngineSupervisor

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


# -- the hook: EngineSupervisor.fail_for_good, the one place every failed start goes through ------------


def supervisor(tmp_path: Path, choice: OnStartupFailure, rollback: bool = True) -> EngineSupervisor:
    config = SupervisorConfig(engine_argv=("engine",), state_dir=tmp_path, on_startup_failure=choice)
    sup = EngineSupervisor(config, lambda _: None, lambda _: None)
    if rollback:

        async def start_rollback(failure: StartupFailure) -> str | None:
            return None

        sup.start_rollback = start_rollback
    return sup


def test_restart_fails_a_start_for_good_and_not_live(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, OnStartupFailure())
    sup.fail_for_good("engine exited with code 1 during startup")
    assert (sup.machine.state, sup.machine.sub_state) == (EngineState.FAILED, "gave_up")
    assert sup.live[0] is False and not sup.held_unready
    assert sup.machine.current.evidence["on_startup_failure"] == "restart"


def test_stay_unready_holds_a_failed_start_live(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, OnStartupFailure(Strategy.STAY_UNREADY))
    sup.fail_for_good("PRECHECK refused the start: memory_budget: …")
    assert (sup.machine.state, sup.machine.sub_state) == (EngineState.FAILED, "stay_unready")
    live, why = sup.live
    assert live and "stay-unready" in why and sup.held_unready and sup.unrecoverable is None
    assert sup.startup_failure is not None and sup.startup_failure.bundle == "initial"


def test_rollback_once_then_the_next_failed_start_gives_up(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, ROLLBACK_B)
    sup.fail_for_good("not ready within --startup-timeout 5s")
    assert sup.machine.sub_state == "rolling_back" and sup.live[0] and sup.rolled_back
    sup.machine.transition(EngineState.STARTING, "rollback to b", StartingPhase.RESTARTING)
    sup.fail_for_good("b failed too")
    assert sup.machine.sub_state == "gave_up" and sup.live[0] is False


def test_rollback_without_a_starter_or_under_an_operation_gives_up(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, ROLLBACK_B, rollback=False)
    sup.fail_for_good("x")
    assert sup.machine.sub_state == "gave_up"
    sup = supervisor(tmp_path / "2", ROLLBACK_B)
    sup.operation_lock.take("switch_bundle op-1")
    sup.fail_for_good("x")
    assert sup.machine.sub_state == "gave_up" and not sup.rolled_back


def test_a_failure_after_serving_is_no_start_and_gives_up_whatever_the_strategy(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, OnStartupFailure(Strategy.STAY_UNREADY))
    sup.machine.transition(EngineState.FAILED, "engine exited while serving")
    sup.fail_for_good("engine exited while serving; restart budget spent")
    assert sup.machine.sub_state == "gave_up" and sup.startup_failure is None and sup.live[0] is False


def test_usage_error_is_exit_2_before_loading_and_quotes_the_engine() -> None:
    from corral.supervisor.lifecycle.failure_strategy import usage_error

    tail = ["usage: vllm serve [-h] ...", "vllm serve: error: unrecognized arguments: --bogus"]
    reason = usage_error(2, True, tail)
    assert reason is not None and "unrecognized arguments: --bogus" in reason and "not retried" in reason
    assert usage_error(2, False, tail) is None  # exit 2 after loading began: not a usage error
    assert usage_error(1, True, tail) is None  # a crash, which a restart may fix
    assert usage_error(None, True, tail) is None
