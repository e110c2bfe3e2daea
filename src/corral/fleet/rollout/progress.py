"""What `corral rollout` and `corral rollback` print while they run: one line per step, written when
the step ends, naming groups as `corral status` does (the new group's own name, not the rollout's
working label for it); while a step runs, a terminal shows it on a transient status line that leaves
nothing behind. The end is one summary line (the change record holds every step)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from corral.contracts.records import RolloutRecord
from corral.fleet.rollout.steps import Step

NEW_MARK = "'"  # groups.py labels a new group `g0'` until it has a name of its own


def group_words(step: Step) -> str:
    """The group a step line names: the group's name as `status` prints it; a START that failed
    before its group had a name says which group it was to replace."""
    group = step.group or ""
    if group.endswith(NEW_MARK):
        return f"new for {group[: -len(NEW_MARK)]}"
    return group


class StepPrinter:
    """The rollout's StepObserver: one line per finished step."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._status: Status | None = None

    def __call__(self, step: Step, finished: bool) -> None:
        if not finished:
            self._running(step)
            return
        self._stop()
        mark = "[green]✓[/green]" if step.ok else "[red]✗[/red]"
        where = escape(f"{step.step:<9} {group_words(step):<14}")
        line = f"{mark} {where} {step.seconds:7.2f}s  {escape(step.detail)}"
        self.console.print(line, markup=True, highlight=False)

    def _running(self, step: Step) -> None:
        if not self.console.is_terminal:  # a log or a pipe gets the finished line only
            return
        text = f"{step.step} {group_words(step)}".rstrip() + " …"
        if self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def summary_line(record: RolloutRecord) -> str:
    """The last line: outcome, how many steps and groups, how long, and why (rich markup)."""
    colour = "green" if record.outcome == "succeeded" else "red"
    moved = len(record.replaced)
    seconds = max(0.0, record.finished - record.started)
    groups = f"{moved} group{'' if moved == 1 else 's'} moved"
    return (
        f"[{colour}]{record.kind} {record.id} {record.outcome}[/{colour}] in {seconds:.1f}s "
        f"({len(record.steps)} steps, {groups}): {escape(record.reason)}"
    )


def requests_line(record: RolloutRecord) -> str:
    """The requests the router answered during the change and how many failed, by its own counters
    read at PRECHECK and at the end (rich markup); or why they were not counted."""
    failures = record.request_failures
    if failures is None:
        why = next((line for line in record.not_measured if line.startswith("request failures:")), "")
        return escape(f"requests during the {record.kind}: not counted ({why or 'no router totals'})")
    during = failures.during
    colour = "red" if during.errors else "green"
    return (
        f"requests during the {record.kind}: {during.requests} answered by the router, "
        f"[{colour}]{during.errors} failed[/{colour}] ({during.stream_failures} streams cut; "
        f"{during.abandoned} taken off a failed engine)"
    )
