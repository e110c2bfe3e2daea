"""`corral doctor`'s diagnosis: the runbook's tree (process dead? alive but not ready? preload path?
memory? requests failing?) walked for each engine from what its supervisor, the engine and the router
say, down to the first branch that explains what is wrong, with the evidence and the next command.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import aiohttp

from corral.clients.access import ADMIN_KEY_FLAG, ADMIN_URL_FLAG, ENGINE_KEY_ENV, ENGINE_KEY_FLAG
from corral.engine_state import EngineState
from corral.fleet.checks.doctor_answering import not_answering_branch, silent_failure_branch, stalled_words
from corral.fleet.checks.doctor_gpu import gpu_fault_branch, recovered_fault_branch, with_stable_settings
from corral.fleet.checks.doctor_pd import pd_branch
from corral.fleet.checks.doctor_routing import not_routing_ready, router_healthy_evidence
from corral.fleet.checks.doctor_sleep import memory_not_released, memory_note, partial_wake
from corral.fleet.checks.doctor_streams import aborted_streams
from corral.fleet.checks.operation_words import operation_in_flight, operation_words
from corral.fleet.checks.probe import EngineView, FleetView

HEALTHY = "healthy"
_DEPENDENCY = re.compile(r"required dependency|dependenc|--requires|--wait-for", re.IGNORECASE)
_RANK = re.compile(r"worker ?proc|rank \d+|ranks? failed|nccl", re.IGNORECASE)
_LOADING = {"engine_starting", "loading_model", "allocating_kv_cache", "capturing_graphs", "server_starting"}


@dataclass(frozen=True)
class Diagnosis:
    engine: str
    branch: str  # e.g. "not-ready/sleeping"; "healthy" when nothing was found
    evidence: str
    next_command: str

    @property
    def healthy(self) -> bool:
        return self.branch == HEALTHY

    def to_json(self) -> dict[str, str]:
        return {
            "engine": self.engine,
            "branch": self.branch,
            "evidence": self.evidence,
            "next": self.next_command,
        }


def _last_lines(e: EngineView) -> list[str]:
    state = e.state or {}
    lines = list((state.get("evidence") or {}).get("last_lines") or [])
    for restart in state.get("restarts") or []:
        lines += list(restart.get("last_lines") or [])
    return [str(line) for line in lines]


def _matching(lines: list[str], pattern: re.Pattern[str]) -> str | None:
    return next((line for line in reversed(lines) if pattern.search(line)), None)


def _logs_hint(e: EngineView) -> str:
    return e.logs_command()


_KV_SHORTFALL = (
    "the engine's KV cache is smaller than its memory budget: check for other processes on its GPUs "
    "(nvidia-smi), compare with `corral supervise --explain`, raise --gpu-memory-utilization or lower "
    "--max-model-len"
)
_DAEMON_DIED = (
    "read the daemon's last lines (`preload_exited` in the operation log); the supervisor restarts it "
    "and the engine from it (corral_supervisor_preload_restarts_total); if it keeps dying, check its "
    "memory and socket path"
)

_DAEMON_RANK = (
    "a rank of the preload daemon died while its parent ran on (vLLM's /health 503): read "
    "`preload_rank_lost` in the operation log (the rank, its pid, its last lines) and that GPU's state "
    "(nvidia-smi, dmesg for Xid); the supervisor stops the daemon and restarts it, then the engine from it"
)


def _not_running(e: EngineView) -> Diagnosis | None:
    """Process dead, or alive but not ready: read from the supervisor's lifecycle state."""
    state = e.state or {}
    lifecycle, sub = e.lifecycle, str(state.get("sub_state") or "")
    reason = str(state.get("reason") or "")
    lines = _last_lines(e)
    dependency = _matching(lines, _DEPENDENCY)
    if (lifecycle == EngineState.STARTING and sub == "waiting_dependencies") or "dependenc" in reason.lower():
        gates = state.get("gates") or []
        return Diagnosis(
            e.name,
            "not-ready/dependency",
            f"{lifecycle} ({sub}): {reason}; gates {gates}",
            "start the dependency first (or fix --wait-for), then: " + _logs_hint(e),
        )
    if lifecycle in (EngineState.FAILED, EngineState.STARTING) and dependency is not None:
        return Diagnosis(
            e.name,
            "not-ready/dependency",
            f"{lifecycle}: {reason}; engine said: {dependency.strip()[:200]}",
            "start the dependency the engine names (or gate on it with `corral supervise --wait-for`), "
            "then restart the supervisor",
        )
    died = lifecycle == EngineState.FAILED or (lifecycle == EngineState.STARTING and sub == "restarting")
    if died and (gpu := gpu_fault_branch(e, died=True)) is not None:  # an Xid, CUDA or NCCL error named
        return Diagnosis(e.name, *gpu)
    rank = _matching(lines, _RANK)
    if lifecycle in (EngineState.FAILED, EngineState.STARTING) and rank is not None:
        return Diagnosis(
            e.name,
            "not-ready/rank-failure",
            f"{lifecycle}: {reason}; {rank.strip()[:200]}",
            "keep the whole serving group out of routing; restart it as one: " + _logs_hint(e),
        )
    if lifecycle == EngineState.FAILED and "not ready within --startup-timeout" in reason:
        return Diagnosis(
            e.name,
            "not-ready/loading-past-startup-budget",
            reason,
            "raise --startup-timeout to cover the longest legal load, or check the artifact and memory",
        )
    if lifecycle == EngineState.FAILED and "during startup" in reason:
        return Diagnosis(
            e.name,
            "process-dead/startup-crash",
            f"{reason}; last lines: {' | '.join(line.strip() for line in lines[-3:])[:300]}",
            f"inspect the engine log, then restart a known-good revision: {_logs_hint(e)}",
        )
    if lifecycle == EngineState.FAILED and "not the expected" in reason:
        return Diagnosis(
            e.name,
            "requests-failing/stale-identity",
            reason,
            "fix --model or the engine's --served-model-name",
        )
    if lifecycle == EngineState.FAILED and ("stalled" in reason or "smoke request failed" in reason):
        return Diagnosis(
            e.name,
            "requests-failing/hang",
            stalled_words(reason),
            "the supervisor restarts it in place; if it recurs, capture a stack (py-spy dump) first",
        )
    if lifecycle in (EngineState.FAILED, EngineState.STARTING) and "preload daemon rank" in reason:
        return Diagnosis(e.name, "preload/daemon-rank-lost", f"{lifecycle} ({sub}): {reason}", _DAEMON_RANK)
    if lifecycle in (EngineState.FAILED, EngineState.STARTING) and "preload daemon" in reason:
        return Diagnosis(e.name, "preload/daemon-died", f"{lifecycle} ({sub}): {reason}", _DAEMON_DIED)
    if (silent := silent_failure_branch(e)) is not None:
        return Diagnosis(e.name, *silent)
    if lifecycle == EngineState.FAILED:
        return Diagnosis(e.name, "process-dead/failed", reason, _logs_hint(e))
    if lifecycle == EngineState.STARTING and sub == "restarting":
        return Diagnosis(
            e.name,
            "process-dead/startup-crash",
            f"{reason}; last lines: {' | '.join(line.strip() for line in lines[-3:])[:300]}",
            _logs_hint(e),
        )
    if lifecycle == EngineState.STARTING and (sub in _LOADING or sub == "smoke_testing"):
        return Diagnosis(
            e.name,
            "not-ready/loading",
            f"STARTING ({sub}) since {state.get('since')}: {reason}",
            f"wait (startup budget); watch it: {_watch_hint(e)}",
        )
    if lifecycle in (EngineState.DRAINING, EngineState.STOPPING):
        return Diagnosis(e.name, "not-ready/draining", f"{lifecycle} ({sub}): {reason}", _logs_hint(e))
    return None


def _watch_hint(e: EngineView) -> str:
    where = f"--port {e.local_port}" if e.local_port is not None else f"--supervisor {e.supervisor_url}"
    return f"corral status {where} --watch"


def _operation_running(e: EngineView) -> Diagnosis | None:
    """An engine out of READY because a runbook operation holds it (a sleep draining, a wake, a
    reload): nothing is wrong yet; the branches below would misread its passing states."""
    op = operation_in_flight(e.state)
    if op is None or e.lifecycle in (EngineState.READY, EngineState.FAILED):
        return None
    state = e.state or {}
    sub = f" ({words})" if (words := str(state.get("sub_state") or "").replace("_", " ")) else ""
    return Diagnosis(
        e.name,
        "not-ready/operation-in-flight",
        f"an operation is in flight: {operation_words(op, since_word='since')}; {e.lifecycle}{sub}",
        f"wait, or follow it with `{_watch_hint(e)}`",
    )


def _wake_hint(e: EngineView) -> str:
    if e.supervisor_url is None:
        return (
            "run the engine under `corral supervise` (the runbook's wake verifies it and smokes it before "
            "readiness returns), then: corral wake --supervisor URL"
        )
    return f"corral wake {e.cli_address} (it verifies the engine and smokes it before readiness returns)"


async def _answers_a_token(engine_url: str, model: str, within: float, headers: dict[str, str]) -> bool:
    body = {"model": model, "prompt": "corral doctor", "max_tokens": 1, "stream": True}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                engine_url + "/v1/completions",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=within),
            ) as resp:
                if resp.status != 200:
                    return False
                async for raw in resp.content:
                    if raw.startswith(b"data: {"):
                        return True
    except (aiohttp.ClientError, TimeoutError):
        return False
    return False


async def diagnose_engine(
    e: EngineView, probe_seconds: float, engine_headers: dict[str, str] | None = None
) -> Diagnosis:
    if e.supervisor_url is not None and e.state is None:
        return Diagnosis(
            e.name,
            "process-dead/supervisor",
            f"{e.supervisor_url}: {e.state_error}",
            "check the supervisor's process and log (`corral up` prints its log dir)",
        )
    if (quiet := not_answering_branch(e)) is not None:  # before DRAINING's own branch
        return Diagnosis(e.name, *quiet)
    found = _operation_running(e) or _not_running(e)
    if found is not None:
        return found
    if e.health != 200:
        return Diagnosis(
            e.name,
            "process-dead/engine",
            f"supervisor says {e.lifecycle} but {e.engine_url}/health answers {e.health or 'nothing'}",
            f"the supervisor will notice and restart it; meanwhile: {_logs_hint(e)}",
        )
    for sleep_branch in (partial_wake, memory_not_released):
        found_asleep = sleep_branch(e)
        if sleep_branch is memory_not_released:  # and the graph/NCCL settings changed from the stable bundle
            found_asleep = with_stable_settings(found_asleep, e)
        if found_asleep is not None:
            return Diagnosis(e.name, *found_asleep)
    if e.sleeping:
        return Diagnosis(
            e.name,
            "not-ready/sleeping",
            f"{e.dev_url}/is_sleeping is true" + memory_note(e),
            _wake_hint(e),
        )
    recovered = recovered_fault_branch(e)  # serving again after an Xid, a CUDA or an NCCL error
    if recovered is not None:
        return Diagnosis(e.name, *recovered)
    evidence = e.evidence
    for kind, branch, command in (
        ("fingerprint", "preload/fingerprint-mismatch", "align model/revision/dtype/layout with the daemon"),
        ("preload_exit", "preload/daemon-died", _DAEMON_DIED),
        ("fallback", "preload/fallback-to-disk", "check the preload daemon's /health and socket owner"),
        ("oom", "memory/oom", "lower --gpu-memory-utilization or max-num-seqs; check memory ownership"),
        ("kv_shortfall", "memory/kv-shortfall", _KV_SHORTFALL),
        ("rank", "not-ready/rank-failure", "restart the whole serving group as one"),
    ):
        entry = evidence.get(kind) or {}
        if int(entry.get("count", 0)):
            last = (entry.get("last") or [""])[-1]
            return Diagnosis(e.name, branch, f"{kind}×{entry['count']}: {str(last).strip()[:240]}", command)
    if e.models is None and e.models_status == 401:
        return Diagnosis(
            e.name,
            "requests-failing/engine-api-key",
            e.models_problem,
            f"pass {ENGINE_KEY_FLAG} FILE (the engine's --api-key) or set {ENGINE_KEY_ENV}",
        )
    model = next(iter(e.base_models), None)
    if (
        model is not None
        and e.engine_url
        and not await _answers_a_token(e.engine_url, model, probe_seconds, engine_headers or {})
    ):
        return Diagnosis(
            e.name,
            "requests-failing/hang",
            f"/health 200 but no token within {probe_seconds:g}s for a 1-token request",
            "capture a stack (py-spy dump --pid ENGINE_PID), then drain it and let it restart: "
            f"corral supervise prestop --url {e.supervisor_url}",
        )
    return Diagnosis(e.name, HEALTHY, f"{e.lifecycle}, /health 200, serving {model}", "-")


def diagnose_router(view: FleetView) -> list[Diagnosis]:
    if view.router_endpoints is None:
        if view.router_refused:  # up, but it wants its admin key or its admin port
            return [
                Diagnosis(
                    "router",
                    "router/admin-routes-refused",
                    view.router_error,
                    f"pass {ADMIN_KEY_FLAG} FILE (the router's --admin-key-file), or {ADMIN_URL_FLAG} "
                    "URL for a router with --admin-port",
                )
            ]
        if view.target.router:
            return [
                Diagnosis("router", "requests-failing/router-down", view.router_error, "restart the router")
            ]
        return []
    by_url = view.by_engine_url()
    found: list[Diagnosis] = []
    streams = aborted_streams(view)
    if streams is not None:
        found.append(Diagnosis("router", *streams))
    for ep in view.router_endpoints:
        engine = by_url.get(ep.url)
        if not ep.routable or engine is None:
            continue
        dead = engine.health != 200
        unready = engine.state is not None and engine.lifecycle != EngineState.READY
        if dead or unready:
            said = f"/health {engine.health or 'nothing'}" if dead else f"supervisor {engine.lifecycle}"
            found.append(
                Diagnosis(
                    "router",
                    "requests-failing/router-lists-dead-engine",
                    f"router routes to {ep.url} ({ep.why}), which answers {said}",
                    "give the router the supervisor's stream (--supervised ENGINE=SUPERVISOR) or fix its "
                    f"discovery; check: corral status {view.target.cli_flags}".rstrip(),
                )
            )
    missed = not_routing_ready(view)
    if missed is not None:
        found.append(Diagnosis(*missed))
    if not found:  # the router has its row whether or not anything is wrong with it
        found.append(Diagnosis("router", HEALTHY, router_healthy_evidence(view), "-"))
    return found


async def diagnose(view: FleetView, probe_seconds: float = 3.0) -> list[Diagnosis]:
    keyed = view.target.access.engine_headers()
    engines = await asyncio.gather(*(diagnose_engine(e, probe_seconds, keyed) for e in view.engines))
    return [*engines, *diagnose_router(view), *(Diagnosis(*f) for f in await pd_branch(view, probe_seconds))]
