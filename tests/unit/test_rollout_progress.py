"""The rollout's step lines (corral.fleet.rollout.progress): one per finished step, the group named as
the fleet names it, and text from engines or supervisors printed as it is, never read as markup."""

from __future__ import annotations

import io

from rich.console import Console

from corral.fleet.rollout.progress import StepPrinter, group_words
from corral.fleet.rollout.steps import Step


def printed(*steps: tuple[Step, bool]) -> str:
    out = io.StringIO()
    printer = StepPrinter(Console(file=out, width=200, force_terminal=False))
    for step, finished in steps:
        printer(step, finished)
    return out.getvalue()


def test_a_step_is_printed_once_when_it_ends() -> None:
    step = Step("START", "g0'")
    step.group, step.ok, step.detail = "g2", True, "g2 (engine-2) READY on v2"
    text = printed((step, False), (step, True))
    assert text.count("START") == 1 and "g2" in text and "g0" not in text, text


def test_a_start_that_failed_before_its_group_had_a_name_says_which_it_replaced() -> None:
    assert group_words(Step("START", "g0'")) == "new for g0"
    assert group_words(Step("DRAIN", "g0")) == "g0" and group_words(Step("PRECHECK", None)) == ""


def test_details_are_printed_as_they_are_not_as_markup() -> None:
    step = Step("VERIFY", "g[bold]1")
    step.detail = "smoke failed on [red]x[/red] and [/] here"
    text = printed((step, True))
    assert "g[bold]1" in text and "[red]x[/red] and [/] here" in text, text
