"""Which `/wake_up` calls one wake makes, from the sleep level, the memory tags still asleep and the
tags asked for; and VERIFY of a partial wake (the woken memory is back, the rest is still freed, the
engine still sleeps).

vLLM wakes in steps (`wake_up?tags=weights`, then `tags=kv_cache`); an engine with any tag asleep
reports `is_sleeping` true and must not serve. A wake that leaves a memory tag asleep is partial: it
keeps the engine SLEEPING and out of routing. The wake that wakes the last ones completes it, with a
final untagged `wake_up` that resumes scheduling, then the full VERIFY.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from corral.engine.dev_api import WAKE_TAGS, EngineAdmin, EngineFigures
from corral.engine.metric_names import SLEEP_STATE
from corral.supervisor.runbook.template import Evidence, Refused, StepFailed

MEMORY_TAGS = ("weights", "kv_cache")
_FIGURE = {"weights": "gpu_weights_bytes", "kv_cache": "gpu_kv_cache_bytes"}


def asleep_tags(status: dict[str, Any]) -> list[str]:
    """The memory tags a sleep left asleep (and no wake has woken since)."""
    recorded = status.get("asleep_tags")
    if isinstance(recorded, list):
        return [t for t in MEMORY_TAGS if t in recorded]
    if status.get("level") in (1, 2):
        return list(MEMORY_TAGS)
    return ["kv_cache"] if status.get("kv_released") else []


def check_tag_names(tags: list[str] | None) -> None:
    unknown = [t for t in tags or [] if t not in WAKE_TAGS]
    if unknown:
        raise Refused(f"wake tags {unknown} do not exist; the tags are {', '.join(WAKE_TAGS)}")


@dataclass(frozen=True)
class WakeSteps:
    """One wake: the memory tags it wakes (in order), whether that completes the wake, and its calls
    as (name for the evidence, tags of the `/wake_up` call or None for `reload_weights`)."""

    waking: list[str]
    still_asleep: list[str]
    completes: bool
    calls: list[tuple[str, list[str] | None]]

    @property
    def sequence(self) -> list[str]:
        return [name for name, _ in self.calls]


RELOAD = "collective_rpc reload_weights"


def plan_wake(level: Any, asleep: list[str], tags: list[str] | None, reload: bool) -> WakeSteps:
    """Raises `Refused` (nothing changed) for a wake vLLM would ignore or that would serve garbage."""
    if tags:
        asked = set(tags)
        not_asleep = sorted(asked & set(MEMORY_TAGS) - set(asleep))
        if not_asleep:
            raise Refused(
                f"wake tags {not_asleep} are not asleep (asleep: {asleep or 'none'}); vLLM would "
                "ignore the whole call. Wake the tags still asleep, or omit tags"
            )
        waking = [t for t in MEMORY_TAGS if t in asked]
        completes = set(asleep) <= asked
        if "scheduling" in asked and not completes:
            remaining = [t for t in asleep if t not in asked]
            raise Refused(
                f"wake tag scheduling would resume serving while {remaining} is asleep; "
                f"wake {remaining} with it, or omit tags"
            )
    else:
        waking, completes = list(asleep), True
    if "weights" in waking and level == 2 and not reload:
        raise Refused(
            "wake refused: a level-2 sleep discarded the weights; waking them without "
            "reload_weights would serve garbage. Wake with reload (corral wake --reload)"
        )
    calls: list[tuple[str, list[str] | None]] = []
    if tags or level == 2:
        for tag in waking:
            calls.append((f"wake_up?tags={tag}", [tag]))
            if tag == "weights" and level == 2:
                calls.append((RELOAD, None))
    if completes:
        calls.append(("wake_up", []))
    still = [t for t in asleep if t not in waking]
    return WakeSteps(waking=waking, still_asleep=still, completes=completes, calls=calls)


Reload = Callable[[], Awaitable[Evidence]]  # `reload_weights`, read per rank (runbook/reload_checks.py)


async def run_calls(admin: EngineAdmin, steps: WakeSteps, reload: Reload | None = None) -> list[Evidence]:
    done: list[Evidence] = []
    for _name, call_tags in steps.calls:
        if call_tags is None:
            result = await (reload() if reload is not None else admin.reload_weights())
            done.append({"reload_weights": result})
        else:
            key = f"wake_up {' '.join(call_tags)}" if call_tags else "wake_up"
            done.append({key: await admin.wake_up(call_tags or None)})
    return done


async def verify_partial(
    admin: EngineAdmin, before: EngineFigures | None, woken: list[str], still_asleep: list[str]
) -> Evidence:
    """VERIFY of a partial wake: still sleeping (never routable), each woken tag's memory back to
    what it was before the sleep, each tag still asleep still freed, woken weights valid."""
    if not await admin.is_sleeping():
        raise StepFailed(
            f"the engine reports is_sleeping false after waking only {woken}; a partially woken "
            "engine must stay asleep and out of routing"
        )
    figures = await admin.figures()
    if figures.sleep_state == "awake":
        raise StepFailed(f"{SLEEP_STATE} is awake after a partial wake", figures=figures.to_json())
    memory: Evidence = {}
    if before is not None:
        for tag in MEMORY_TAGS:
            name = _FIGURE[tag]
            want, got = getattr(before, name), getattr(figures, name)
            if want is None or got is None:
                continue
            memory[name] = [want, got]
            if tag in woken and got < want:
                raise StepFailed(
                    f"tag {tag} woken but {name} is {got:.0f}, below the {want:.0f} before the sleep",
                    figures=figures.to_json(),
                )
            if tag in still_asleep and got > 0:
                raise StepFailed(
                    f"tag {tag} should still be asleep but {name} is {got:.0f}", figures=figures.to_json()
                )
    if "weights" in woken and figures.weights_valid is not None and figures.weights_valid < 1:
        raise StepFailed("the woken weights are not valid (woken without reload)", figures=figures.to_json())
    return {
        "is_sleeping": True,
        "woken_tags": woken,
        "asleep_tags": still_asleep,
        "sleep_state": figures.sleep_state,
        "memory": memory or None,  # None: no engine figures; the caller reads the device
        "figures": figures.to_json(),
    }
