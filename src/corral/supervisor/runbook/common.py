"""What the operations share: the drain sequence's first two steps (leave routing, the policy) as
the operations' evidence, checking an awake engine (VERIFY), and RECOVER's two ways back to a
known state (awake and READY again, or a restart in place)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from corral.engine.dev_api import AdminCallFailed, EngineAdmin, EngineFigures
from corral.engine.kv_log import EngineLogFigures
from corral.engine.metric_names import SLEEP_STATE
from corral.supervisor.checks.readiness import NotReady
from corral.supervisor.lifecycle.device_memory import DeviceReading, engine_visible_devices, read_device
from corral.supervisor.lifecycle.drain import Leaving
from corral.supervisor.lifecycle.memory_checks import (
    ENGINE_METRICS,
    FAILED,
    PASSED,
    MemoryVerdict,
    not_measured,
    reported,
    wake_verdict,
)
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.prefix_reset import prefix_state_after
from corral.supervisor.runbook.rank_guard import rank_evidence, refuse_unless_whole
from corral.supervisor.runbook.template import Evidence, Refused, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess

S = EngineState
SLEEP_MODES = ("wait", "abort", "keep")


def admin_for(sup: EngineAccess) -> EngineAdmin:
    return EngineAdmin(sup.session, sup.config.engine_url)


def argv_value(argv: tuple[str, ...] | list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def zero_copy_preload(argv: tuple[str, ...] | list[str]) -> bool:
    """`--load-format ipc_cache` in its default (or explicit) zero_copy mode: the weights belong to the
    preload daemon and sleep must not offload or free them."""
    if argv_value(argv, "--load-format") != "ipc_cache":
        return False
    extra = argv_value(argv, "--model-loader-extra-config") or ""
    return '"copy"' not in extra.replace(" ", "")


async def require_ready_and_dev(sup: EngineAccess, admin: EngineAdmin, kind: str) -> Evidence:
    """Preconditions every operation on a serving engine shares."""
    state = sup.machine.state
    if state is not S.READY:
        extra = f" ({sup.sleep_status.to_json()})" if sup.sleep_status else ""
        raise Refused(f"{kind} refused: the engine is {state}{extra}, not READY")
    refuse_unless_whole(sup, kind)
    try:
        dev = await admin.dev_mode()
    except AdminCallFailed as exc:
        raise Refused(f"{kind} refused: cannot ask the engine ({exc})") from exc
    if not dev:
        raise Refused(
            f"{kind} refused: the engine has no development endpoints (GET /is_sleeping is 404); "
            "start it with VLLM_SERVER_DEV_MODE=1 behind a trusted management plane"
        )
    if await admin.is_sleeping():
        raise Refused(
            f"{kind} refused: the engine reports is_sleeping true although the supervisor has it READY"
        )
    return {"state": state.value, "epoch": sup.machine.epoch, "dev_mode": True}


def require_sleep_mode(sup: EngineAccess, kind: str) -> Evidence:
    argv = sup.config.engine_argv
    if "--enable-sleep-mode" not in argv:
        raise Refused(f"{kind} refused: the engine was not started with --enable-sleep-mode")
    if zero_copy_preload(argv):
        raise Refused(
            f"{kind} refused: the engine maps its weights zero-copy from a preload daemon "
            "(--load-format ipc_cache); sleep cannot offload or free memory it does not own"
        )
    return {"enable_sleep_mode": True, "zero_copy_preload": False}


async def leave_routing(sup: EngineAccess, reason: str, policy: str) -> tuple[Leaving, Evidence]:
    """READY → DRAINING and routing left: the drain sequence's first step (`lifecycle/drain.py`)."""
    leaving = await sup.drain_sequence.leave(reason, policy)
    return leaving, leaving.evidence()


async def apply_policy(sup: EngineAccess, leaving: Leaving, mode: str) -> Evidence:
    """The drain sequence's policy step; a `wait` whose requests did not finish fails the operation."""
    evidence = await sup.drain_sequence.apply_policy(leaving, mode)
    if mode == "wait" and not leaving.report.in_flight_drained:
        raise StepFailed(
            f"in-flight requests did not finish within --drain-timeout {sup.config.drain.drain_timeout:g}s",
            notes=leaving.report.notes,
        )
    return evidence


async def device_reading(sup: EngineAccess, figures: EngineFigures) -> DeviceReading | None:
    """NVML's reading of the engine's process tree, where the engine reports no memory figures."""
    if reported(figures):
        return None
    engine = sup.engine
    if engine is None or not engine.running:
        return None
    visible = engine_visible_devices(sup.config.engine_env)
    return await read_device(engine.pid, visible, also=engine.ranks.survivors())


def device_verdict(
    sup: EngineAccess,
    kind: str,
    before: DeviceReading | None,
    after: DeviceReading | None,
    decide: Callable[[DeviceReading, DeviceReading], MemoryVerdict],
) -> Evidence:
    """VERIFY's memory check on NVML's readings (not_measured without them): recorded on the
    supervisor, a failure raised as the step's failure."""
    verdict = not_measured() if before is None or after is None else decide(before, after)
    sup.note_memory(kind, verdict)
    if verdict.failed:
        raise StepFailed(verdict.reason, memory=verdict.to_json())
    return verdict.to_json()


def figures_passed(sup: EngineAccess, kind: str, moved: Evidence) -> Evidence:
    """The engine's own figures passed VERIFY's memory check: say so, and where they came from."""
    verdict = MemoryVerdict(PASSED, "the engine's memory figures moved as expected", ENGINE_METRICS, moved)
    sup.note_memory(kind, verdict)
    return verdict.to_json()


def figures_failed(sup: EngineAccess, kind: str, reason: str, **evidence: Any) -> StepFailed:
    """The engine's own figures failed VERIFY's memory check: recorded, and the step's failure."""
    sup.note_memory(kind, MemoryVerdict(FAILED, reason, ENGINE_METRICS, evidence))
    return StepFailed(reason, **evidence)


def logged_figures(sup: EngineAccess) -> EngineLogFigures | None:
    return sup.engine.log_figures if sup.engine is not None else None


async def verify_awake(
    sup: EngineAccess,
    admin: EngineAdmin,
    before: EngineFigures | None,
    device_before: DeviceReading | None = None,
    kind: str = "wake",
) -> Evidence:
    """VERIFY after a wake: not sleeping, sleep state awake, memory back, same model, smoke answered."""
    if await admin.is_sleeping():
        raise StepFailed("the engine still reports is_sleeping true")
    figures = await admin.figures()
    if figures.sleep_state not in (None, "awake"):
        raise StepFailed(f"{SLEEP_STATE} is {figures.sleep_state}, not awake", figures=figures.to_json())
    if figures.weights_valid is not None and figures.weights_valid < 1:
        raise StepFailed(
            "the engine's weights are not valid (weights woken without reload)", figures=figures.to_json()
        )
    memory: Evidence | None = None
    if before is not None and reported(before) and reported(figures):
        moved: Evidence = {}
        for name in ("gpu_weights_bytes", "gpu_kv_cache_bytes"):
            want, got = getattr(before, name), getattr(figures, name)
            if want is not None and got is not None and got < want:
                reason = f"{name} is {got:.0f}, below the {want:.0f} before the sleep"
                raise figures_failed(sup, kind, reason, figures=figures.to_json())
            moved[name] = [want, got]
        memory = figures_passed(sup, kind, moved)
    elif before is not None:
        thresholds, logged = sup.config.memory, logged_figures(sup)
        memory = device_verdict(
            sup,
            kind,
            device_before,
            await device_reading(sup, figures),
            lambda b, a: wake_verdict(b, a, [], logged, thresholds),
        )
    try:
        model = await sup.readiness.served_model(sup.session)
        if sup.served_model is not None and model != sup.served_model:
            raise StepFailed(f"the engine serves {model!r}, not {sup.served_model!r}")
        smoke = await sup.readiness.first_smoke(sup.session, model)
    except NotReady as exc:
        raise StepFailed(f"readiness after wake: {exc}") from exc
    sup.note_smoke(smoke)
    checked: Evidence = {"is_sleeping": False, "figures": figures.to_json(), "model": model}
    checked["warmup_ttft_ms"] = smoke.warmup_ttft_ms  # the first request's; steady state is OBSERVE's
    if memory is not None:
        checked["memory"] = memory
    return {**checked, "smoke": smoke.to_json()}


async def back_to_ready(
    sup: EngineAccess,
    admin: EngineAdmin,
    reason: str,
    cause: str,
    prefix_cache_wiped: bool = False,
    before: EngineFigures | None = None,
) -> Evidence:
    """RECOVER for a failure before the engine slept for good: wake it fully, check it, READY again
    (on a new prefix epoch where the sleep may have emptied the prefix cache: `before` are the figures
    read before it); when that fails too, or a rank was lost (no wake brings it back), FAILED with the
    cause named and a restart in place."""
    if sup.engine is not None and sup.engine.ranks.loss is not None:
        return await fail_and_restart(sup, cause)
    try:
        if await admin.is_sleeping():
            await admin.wake_up()
        checked = await verify_awake(sup, admin, None)
        if prefix_cache_wiped:
            checked["prefix_cache"] = await prefix_state_after(sup, admin, before, "recovery wake")
    except (StepFailed, AdminCallFailed) as exc:
        return await fail_and_restart(sup, f"{cause}; recovery wake failed too: {exc}")
    sup.note_sleep(None)
    sup.transition(S.READY, reason, None, recovered_from=cause, **checked["smoke"])
    sup.resume_serving()
    return {"outcome": "awake and READY again", **checked}


async def fail_and_restart(sup: EngineAccess, cause: str) -> Evidence:
    """RECOVER's last resort: unready (FAILED, the failure named; a rank lost is in the evidence, as
    the rank watch saw it), then a fresh engine from disk."""
    lost = sup.engine is not None and sup.engine.ranks.loss is not None
    ranks = rank_evidence(sup) if lost else {}
    with contextlib.suppress(Exception):
        sup.transition(S.FAILED, cause, None, recoverable=True, **ranks)
    await sup.restart_in_place(cause)
    outcome: Evidence = {"outcome": "FAILED, engine restarted in place (weights from disk)", "failure": cause}
    if lost:
        outcome["rank_lost"] = ranks
    return outcome
