"""`--on-startup-failure restart|stay-unready|rollback=BUNDLE`: what follows a start that cannot reach
READY, chosen before the start, and the one decision (`decide`) that turns a failed start into a verdict.

A start has failed for good once nothing inside it will help: its `--startup-restarts` are spent, its
engine rejected its own command line (`usage_error`: exit code 2 before it loaded anything, never
retried), its `--startup-timeout` passed, it serves the wrong model, its LoRA adapters cannot load,
its dependencies or preload daemon never came up, or PRECHECK refused it (never retried). Then:

- `restart` (the default): FAILED/`gave_up` and `/livez` 503, so that whatever runs the supervisor (the
  kubelet) restarts it; the bounded retry is the pod's restart.
- `stay-unready`: FAILED/`stay_unready`; `/livez` 200 and `/startupz` 200 so that no probe restarts the
  pod, `/readyz` 503 with the reason; nothing restarts by itself, a person looks and may switch the bundle.
- `rollback=BUNDLE`: FAILED/`rolling_back`, then the switch to BUNDLE (a bundle declared with `--bundle`)
  runs as a `rollback` operation through the switch_bundle runbook; at most once per supervisor life, and
  a rollback bundle that fails too ends FAILED/`gave_up` (no ping-pong between two bad bundles).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Strategy(StrEnum):
    RESTART = "restart"
    STAY_UNREADY = "stay-unready"
    ROLLBACK = "rollback"


class Verdict(StrEnum):
    """What a failed start becomes; each is the FAILED sub-state it leaves the engine in."""

    GAVE_UP = "gave_up"  # /livez 503: the process above restarts us (or nothing does, on a bare host)
    STAY_UNREADY = "stay_unready"  # /livez 200, /readyz 503: held for a person
    ROLLING_BACK = "rolling_back"  # the rollback operation is about to start


# FAILED sub-states after which the lifecycle has ended: nothing restarts the engine by itself, and an
# operation waiting on a start (switch_bundle's VERIFY) stops waiting
LIFECYCLE_ENDED = frozenset({Verdict.GAVE_UP.value, Verdict.STAY_UNREADY.value})


class StrategyError(ValueError):
    """A `--on-startup-failure` value that cannot be used; the message names the value and the fix."""


@dataclass(frozen=True)
class OnStartupFailure:
    strategy: Strategy = Strategy.RESTART
    bundle: str | None = None  # the rollback bundle (rollback only)

    def __str__(self) -> str:
        return f"rollback={self.bundle}" if self.strategy is Strategy.ROLLBACK else self.strategy.value


CHOICES = "restart, stay-unready or rollback=BUNDLE"


def parse_on_startup_failure(text: str) -> OnStartupFailure:
    """`restart`, `stay-unready` or `rollback=BUNDLE`; the bundle is checked by `check_rollback_bundle`."""
    value = text.strip()
    name, eq, bundle = value.partition("=")
    if name == Strategy.ROLLBACK.value:
        if not eq or not bundle.strip():
            raise StrategyError(
                f"--on-startup-failure {text!r}: rollback needs the bundle to roll back to, "
                "e.g. rollback=previous (a bundle declared with --bundle FILE)"
            )
        return OnStartupFailure(Strategy.ROLLBACK, bundle.strip())
    if not eq and name in (Strategy.RESTART.value, Strategy.STAY_UNREADY.value):
        return OnStartupFailure(Strategy(name))
    raise StrategyError(f"--on-startup-failure {text!r} is not one of {CHOICES}")


def check_rollback_bundle(choice: OnStartupFailure, declared: Iterable[str], starts_with: str) -> None:
    """A rollback names a bundle declared with --bundle, other than the one the engine starts with."""
    if choice.strategy is not Strategy.ROLLBACK:
        return
    names = sorted(declared)
    if choice.bundle == starts_with:
        raise StrategyError(
            f"--on-startup-failure {choice}: {starts_with!r} is the bundle the engine starts with "
            "(--bundle-name); roll back to another bundle, declared with --bundle FILE"
        )
    if choice.bundle not in names:
        known = ", ".join(names) or "none"
        raise StrategyError(
            f"--on-startup-failure {choice}: bundle {choice.bundle!r} is not declared (declared with "
            f"--bundle: {known}); add its file with --bundle FILE"
        )


USAGE_EXIT_CODE = 2  # argparse's and click's exit on a bad command line (vLLM's `vllm serve`, `corral sim`)


def usage_error(exit_code: int | None, before_loading: bool, last_lines: Iterable[str]) -> str | None:
    """Why an engine exit is a deterministic usage error (an unknown flag, a bad value), which no
    restart fixes: exit code 2 before the engine loaded anything; the reason quotes the engine's own
    error line when its log has one. None for any other exit."""
    if exit_code != USAGE_EXIT_CODE or not before_loading:
        return None
    said = [line.strip() for line in last_lines if "error" in line.lower() and line.strip()]
    quoted = f": {said[-1]}" if said else ""
    return (
        f"the engine rejected its command line (exit code 2, a usage error{quoted}); "
        "not retried: fix the engine command or the bundle's engine_args"
    )


def decide(choice: OnStartupFailure, *, rolled_back: bool, operation: str | None) -> Verdict:
    """The verdict on a start that failed for good. An operation that holds the engine (a bundle switch
    or the rollback itself) was waiting on this start, and its RECOVER decides what runs next: no
    rollback then, and none after a first one."""
    if choice.strategy is Strategy.STAY_UNREADY:
        return Verdict.STAY_UNREADY
    if choice.strategy is Strategy.ROLLBACK and not rolled_back and operation is None:
        return Verdict.ROLLING_BACK
    return Verdict.GAVE_UP


@dataclass(frozen=True)
class StartupFailure:
    """The last start that failed for good, shown in `/v1/state` as `startup_failure`."""

    bundle: str  # the bundle whose start failed
    reason: str
    verdict: Verdict
    choice: OnStartupFailure

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "bundle": self.bundle,
            "reason": self.reason,
            "verdict": self.verdict.value,
            "strategy": str(self.choice),
        }
        if self.verdict is Verdict.ROLLING_BACK:
            body["rollback_to"] = self.choice.bundle
        return body


# Starts the rollback operation (the runbook's, wired in by the composition root: the lifecycle never
# imports the runbook); returns why it could not start, or None once it runs.
RollbackStarter = Callable[[StartupFailure], Awaitable[str | None]]
