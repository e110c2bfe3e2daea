"""`corral verify`'s cleanup check from supervisors' leftover reports and engines' own figures: a find
that holds memory fails, clutter warns, nothing looked at is NOT MEASURED (a failure with
--require-measured), and every leftover is named with its engine."""

from __future__ import annotations

from corral.contracts.supervisor import Leftover, LeftoverCheck, LeftoverReport
from corral.fleet.checks.check import FAIL, NOT_MEASURED, PASS, WARN
from corral.fleet.checks.leftovers import Cleanup
from corral.fleet.checks.probe import EngineView


def _report(*checks: LeftoverCheck) -> LeftoverReport:
    return LeftoverReport(checked_at=0.0, checks=list(checks))


def _found(kind: str, what: str, fails: bool) -> LeftoverCheck:
    return LeftoverCheck(
        kind=kind, verdict="found", reason=what, fails=fails, found=[Leftover(kind=kind, what=what)]
    )


CLEAN = LeftoverCheck(kind="temp_file", verdict="clean", reason="none")


def test_a_failing_find_fails_naming_the_engine() -> None:
    cleanup = Cleanup()
    cleanup.note_report("engine-0", _report(CLEAN))
    cleanup.note_report("engine-1", _report(_found("old_process", "engine (pid 42) still runs", True)))
    check = cleanup.check(require_measured=False)
    assert check.name == "cleanup" and check.verdict == FAIL
    assert "engine-1: engine (pid 42) still runs" in check.detail


def test_clutter_warns_and_clean_passes() -> None:
    cleanup = Cleanup()
    cleanup.note_report(
        "engine-0", _report(_found("temp_file", "temp file /s/.a.0123456789abcdef.tmp", False))
    )
    assert cleanup.check(False).verdict == WARN
    clean = Cleanup()
    clean.note_report("engine-0", _report(CLEAN))
    check = clean.check(False)
    assert check.verdict == PASS and "1 engines" in check.detail


def test_nothing_looked_at_is_not_measured_and_fails_when_required() -> None:
    cleanup = Cleanup()
    cleanup.unmeasured.append("engine-0 (supervisor unreachable)")
    assert cleanup.check(False).verdict == NOT_MEASURED
    assert cleanup.check(True).verdict == FAIL


def test_an_engine_without_a_supervisor_is_judged_by_its_own_backup_figure() -> None:
    awake = EngineView("e", None, "http://e", sleeping=False, metrics="corral_sim_cpu_backup_bytes 2048\n")
    cleanup = Cleanup()
    cleanup.note_engine_figure(awake)
    check = cleanup.check(False)
    assert check.verdict == FAIL and "2048 bytes" in check.detail
    asleep = EngineView("e", None, "http://e", sleeping=True, metrics="corral_sim_cpu_backup_bytes 2048\n")
    expected = Cleanup()
    expected.note_engine_figure(asleep)  # a level-1 backup is expected while asleep
    assert expected.check(False).verdict == NOT_MEASURED
