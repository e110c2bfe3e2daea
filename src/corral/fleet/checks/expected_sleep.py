"""`corral verify --expect-asleep ENGINE[=LEVEL]`: after a planned sleep, the engines that should be
asleep, and the check that they are — supervisor SLEEPING (not partially woken, at the level asked
for), the engine's `/is_sleeping` true and `vllm:engine_sleep_state` matching the level — while
every other engine must be awake.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.engine.metric_names import SLEEP_STATE
from corral.engine_state import EngineState
from corral.fleet.checks.probe import EngineView

STATE_OF_LEVEL = {1: "weights_offloaded", 2: "discard_all"}  # level 0 pauses; vLLM shows no level


class ExpectAsleepError(ValueError):
    """An `--expect-asleep` value that is not ENGINE or ENGINE=LEVEL."""


@dataclass(frozen=True)
class ExpectedAsleep:
    engine: str  # engine name, supervisor URL or engine URL
    level: int | None = None

    @classmethod
    def parse(cls, spec: str) -> ExpectedAsleep:
        name, sep, level = spec.strip().rpartition("=")
        if not sep:
            name = level
        if not name:
            raise ExpectAsleepError(f"{spec!r}: expected ENGINE or ENGINE=LEVEL, e.g. engine-1=1")
        if not sep:
            return cls(name)
        if level not in ("0", "1", "2"):
            raise ExpectAsleepError(f"{spec!r}: the sleep level must be 0, 1 or 2, not {level!r}")
        return cls(name, int(level))

    def matches(self, engine: EngineView) -> bool:
        return self.engine in (engine.name, engine.supervisor_url, engine.engine_url)


def engine_sleep_state(engine: EngineView) -> str | None:
    """The `sleep_state` label whose `vllm:engine_sleep_state` sample is 1 (None: not reported)."""
    for sample in engine.metric(SLEEP_STATE):
        try:
            found = sample.labels.get("sleep_state")
        except ValueError:
            continue
        if found is not None and sample.value == 1:
            return found
    return None


def asleep_problems(engine: EngineView, expected: ExpectedAsleep) -> list[str]:
    """Why `engine` is not asleep as expected; empty when it is."""
    problems: list[str] = []
    state = engine.state
    if state is not None:
        sleep = state.get("sleep") or {}
        if engine.lifecycle != EngineState.SLEEPING:
            problems.append(f"supervisor says {engine.lifecycle}, not SLEEPING")
        else:
            if sleep.get("woken_tags"):
                problems.append(
                    f"partially awake (woken {sleep['woken_tags']}, asleep {sleep.get('asleep_tags')})"
                )
            if expected.level is not None and sleep.get("level") != expected.level:
                problems.append(f"asleep at level {sleep.get('level')}, expected level {expected.level}")
    if engine.sleeping is False:
        problems.append("the engine reports /is_sleeping false")
    elif engine.sleeping is None:
        problems.append("the engine does not answer /is_sleeping (dev mode off or unreachable)")
    want = STATE_OF_LEVEL.get(expected.level) if expected.level is not None else None
    got = engine_sleep_state(engine)
    if want is not None and got is not None and got != want:
        problems.append(f"{SLEEP_STATE} is {got}, expected {want}")
    return problems
