"""PRECHECK's arithmetic as an operator reads it (`corral supervise --explain`): each check's outcome
and reason, then its steps one per line, `name  value  = formula`, the layout of `corral k8s render
--explain`; the last line says whether the start is authorized."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.supervisor.precheck.check import CheckResult, Outcome

GIB = 1 << 30


@dataclass(frozen=True)
class Step:
    """One number of a check and how it was found: `name  value  = formula`."""

    name: str
    value: str
    formula: str


def gib(n: float) -> str:
    """Bytes as GiB with two decimals, the unit vLLM logs memory in."""
    return f"{n / GIB:.2f} GiB"


def step_lines(steps: Sequence[Step]) -> list[str]:
    """The steps aligned on name and value, as a check's evidence `lines`."""
    if not steps:
        return []
    name_width = max(len(s.name) for s in steps)
    value_width = max(8, *(len(s.value) for s in steps))
    return [f"{s.name:<{name_width}}  {s.value:>{value_width}}  = {s.formula}".rstrip(" =") for s in steps]


def verdict(results: Sequence[CheckResult]) -> str:
    """One line: authorized, or refused naming the checks that refused; what was not measured is
    said, since it was not checked."""
    refused = [r.name for r in results if r.outcome is Outcome.REFUSED]
    unmeasured = [r.name for r in results if r.outcome is Outcome.NOT_MEASURED]
    tail = f" (not measured: {', '.join(unmeasured)})" if unmeasured else ""
    if refused:
        return f"start refused by {', '.join(refused)}{tail}"
    return f"start authorized{tail}"


def render(results: Sequence[CheckResult]) -> str:
    """Every check: `name  outcome  reason`, its evidence lines indented below, then the verdict."""
    name_width = max((len(r.name) for r in results), default=0)
    out: list[str] = []
    for result in results:
        out.append(f"  {result.name:<{name_width}}  {result.outcome.value:<12}  {result.reason}")
        lines = result.evidence.get("lines") or []
        out.extend(f"      {line}" for line in lines if isinstance(line, str))
    out.append(f"  {verdict(results)}")
    return "\n".join(out) + "\n"
