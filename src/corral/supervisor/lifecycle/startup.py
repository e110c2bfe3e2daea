"""Startup: from dependency gates to an earned READY — launch the engine, follow its loading phases,
health, model list and smoke request, desired LoRA adapters — restarting a startup failure within its
budget; anything nothing here will fix ends FAILED for good."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from corral.engine.dev_api import AdminCallFailed, EngineAdmin, EngineFigures
from corral.engine.evidence import KV_SHORTFALL
from corral.redaction import redact_argv
from corral.supervisor.checks.adapters import AdapterCallFailed, EngineAdapters, reconcile
from corral.supervisor.checks.bundle import read_bundle
from corral.supervisor.checks.dependencies import GatesTimedOut
from corral.supervisor.checks.preload_load import PreloadLoad, verify_preload_load
from corral.supervisor.checks.readiness import EngineNotAnswering, NotReady, SmokeResult
from corral.supervisor.lifecycle.device_memory import engine_visible_devices, read_device
from corral.supervisor.lifecycle.engine_process import EngineProcess, RestartPolicy
from corral.supervisor.lifecycle.failure_strategy import usage_error
from corral.supervisor.lifecycle.fault_naming import NOT_RESTARTED, fault_naming, hardware_fault
from corral.supervisor.lifecycle.memory_checks import (
    budget_evidence,
    capacity_at_ready,
    reported,
    resident_verdict,
)
from corral.supervisor.lifecycle.stable_command import EngineCommand, compare_with_stable
from corral.supervisor.lifecycle.states import EngineState, StartingPhase
from corral.supervisor.lifecycle.xid_watch import XidWatch
from corral.supervisor.precheck.gate import PrecheckSettings, run_precheck
from corral.supervisor.precheck.identity import merged_env

if TYPE_CHECKING:
    from corral.bundle_spec import BundleSpec
    from corral.engine.evidence import EvidenceBook
    from corral.engine.gpu_faults import GpuFault
    from corral.supervisor.checks.adapters import AdapterSet
    from corral.supervisor.checks.bundle import Bundle
    from corral.supervisor.checks.dependencies import GateWaiter
    from corral.supervisor.checks.engine_auth import EngineKey
    from corral.supervisor.checks.readiness import ReadinessCheck
    from corral.supervisor.lifecycle.config import SupervisorConfig
    from corral.supervisor.lifecycle.engine_process import RestartRecord
    from corral.supervisor.lifecycle.memory_checks import MemoryRecord, MemoryVerdict
    from corral.supervisor.lifecycle.metrics import SupervisorMetrics
    from corral.supervisor.lifecycle.states import StateEvent, StateMachine
    from corral.supervisor.precheck.gate import PrecheckReport
    from corral.supervisor.state.oplog import OperationLog

S = EngineState
_ENGINE_PHASES = frozenset(
    {
        StartingPhase.ENGINE_STARTING,
        StartingPhase.LOADING_MODEL,
        StartingPhase.ALLOCATING_KV_CACHE,
        StartingPhase.CAPTURING_GRAPHS,
        StartingPhase.SERVER_STARTING,
    }
)


class ModelMismatch(Exception):
    """The engine serves, but not the model it was expected to: no restart will fix that."""


class EngineLines(Protocol):
    """Where the engine's log lines go (`publication.Publication`): echoed, and kept as evidence."""

    def engine_line(self, line: str) -> None: ...

    def evidence(self, kind: str, line: str) -> None: ...

    def xid(self, fault: GpuFault) -> None: ...


class StartupHost(Protocol):
    """What startup needs of the supervisor (`EngineSupervisor`): its configuration, state machine and
    records to read and write, the checks it runs, the engine it starts (and the figures it learns of
    it: bundle, PRECHECK, served model, smoke), the preload daemon's fate, and the supervisor's own
    transitions, restarts and failure."""

    engine: EngineProcess | None
    bundle: Bundle | None
    precheck: PrecheckReport | None
    served_model: str | None
    last_smoke: SmokeResult | None
    log: Callable[[str], None]

    @property
    def config(self) -> SupervisorConfig: ...
    @property
    def machine(self) -> StateMachine: ...
    @property
    def oplog(self) -> OperationLog: ...
    @property
    def metrics(self) -> SupervisorMetrics: ...
    @property
    def evidence(self) -> EvidenceBook: ...
    @property
    def memory(self) -> MemoryRecord: ...
    @property
    def session(self) -> aiohttp.ClientSession: ...
    @property
    def running_bundle(self) -> BundleSpec: ...
    @property
    def readiness(self) -> ReadinessCheck: ...
    @property
    def gates(self) -> GateWaiter: ...
    @property
    def engine_key(self) -> EngineKey: ...
    @property
    def adapters(self) -> AdapterSet: ...
    @property
    def publication(self) -> EngineLines: ...

    def transition(
        self, state: EngineState, reason: str, sub_state: str | None = None, /, **evidence: Any
    ) -> StateEvent: ...

    def fail_for_good(self, reason: str, **evidence: Any) -> None: ...

    async def stop_engine(self, grace: float, reason: str) -> int | None: ...

    def gate_log(self, message: str) -> None: ...

    def preload_lost(self) -> str | None: ...

    def watch_preload(self, tasks: set[asyncio.Task[Any]]) -> None: ...

    async def revive_preload(self) -> bool: ...

    def record_exit(self, engine: EngineProcess) -> None: ...

    def record_restart(
        self,
        attempt: int,
        code: int | None,
        reason: str,
        backoff: float,
        cause: str,
        engine: EngineProcess | None = None,
    ) -> RestartRecord: ...

    def note_memory(self, operation: str, verdict: MemoryVerdict) -> None: ...


class EngineStartup:
    """STARTING until READY for one supervisor; every transition on its state machine."""

    def __init__(self, sup: StartupHost) -> None:
        self._sup = sup
        self._base_argv = sup.config.engine_argv  # the command as configured (bundles add to it)
        self.last_ready: EngineCommand | None = None  # the last command that earned READY here
        # the command of the run launched last: what a failure of that run is compared with the stable
        # one on, even once a RECOVER has switched the configuration back (a failed bundle switch)
        self.launched: EngineCommand | None = None

    def running_command(self) -> EngineCommand:
        config = self._sup.config
        return EngineCommand(self._sup.running_bundle.name, config.engine_argv, dict(config.engine_env))

    def graph_nccl_vs_stable(self) -> dict[str, Any] | None:
        """The running bundle's CUDA-graph/NCCL settings against the stable bundle's: the last one READY
        here, else the --on-startup-failure rollback bundle; None when there is no other."""
        config = self._sup.config
        named = config.on_startup_failure.bundle
        spec = next((b for b in config.bundles if b.name == named), None) if named else None
        rollback = EngineCommand(spec.name, spec.argv(self._base_argv), spec.env) if spec else None
        return compare_with_stable(self.launched or self.running_command(), self.last_ready, rollback)

    async def _reconcile_adapters(self) -> str | None:
        """Load the desired LoRA adapters the (re)started engine lacks, before it is READY; the
        failure's reason when one cannot be loaded (a path or name no restart will fix)."""
        if not self._sup.adapters.desired:
            return None
        try:
            result = await reconcile(
                EngineAdapters(self._sup.session, self._sup.config.engine_url), self._sup.adapters
            )
        except AdapterCallFailed as exc:
            self._sup.oplog.append("adapters_reconciled", error=str(exc))
            return f"desired LoRA adapters could not be loaded: {exc}"
        self._sup.oplog.append("adapters_reconciled", **result)
        return None

    async def wait_gates(self) -> bool:
        if not await self._sup.revive_preload():
            return False
        if not self._sup.config.gates:
            return True
        if self._sup.machine.sub_state != StartingPhase.WAITING_DEPENDENCIES:
            self._sup.transition(
                S.STARTING,
                f"waiting for {len(self._sup.config.gates)} dependencies "
                f"(deadline {self._sup.config.dependency_timeout:g}s)",
                StartingPhase.WAITING_DEPENDENCIES,
                gates=[g.spec for g in self._sup.config.gates],
            )
        waiting = asyncio.create_task(self._sup.gates.wait(self._sup.session), name="dependency-gates")
        watched: set[asyncio.Task[Any]] = {waiting}
        self._sup.watch_preload(watched)  # a daemon that dies before it is healthy: revived, not waited out
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in watched - {waiting}:
                task.cancel()
        if not waiting.done():
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            return await self.wait_gates()  # bounded: revive_preload gives up after --preload-restarts
        try:
            waiting.result()
        except GatesTimedOut as exc:
            self._sup.gate_log(str(exc))
            self._sup.fail_for_good(str(exc), gates=self._sup.gates.to_json())
            return False
        self._sup.gate_log("all dependencies are up")
        return True

    def _precheck_settings(self) -> PrecheckSettings:
        """--expect-fingerprint pins the command as configured; another bundle is pinned by its own
        file's `fingerprint:` (or not at all)."""
        settings = self._sup.config.precheck
        bundle = self._sup.running_bundle
        if bundle.name == self._sup.config.bundle_name:
            return settings
        identity = dataclasses.replace(
            settings.identity,
            expect_fingerprint=bundle.fingerprint,
            expect_fingerprint_from=f"fingerprint: of bundle {bundle.name}",
        )
        return dataclasses.replace(settings, identity=identity)

    async def authorize(self) -> bool:
        """PRECHECK before every launch (first start, restarts, a switched bundle): True when the
        start is authorized; a refusal is FAILED at once, the engine never started and never retried."""
        sup = self._sup
        sup.transition(
            S.STARTING,
            "PRECHECK: artifact identity, parallel identity, memory budget, environment, preload",
            StartingPhase.PRECHECK,
        )
        report = await run_precheck(
            sup.config.engine_argv,
            merged_env(sup.config.engine_env),
            self._precheck_settings(),
            sup.config.preload_argv,
        )
        sup.precheck = report
        sup.oplog.append("precheck", **report.to_json())
        sup.log(report.reason)
        if report.authorized:
            return True
        sup.fail_for_good(report.reason, precheck=report.to_json())
        return False

    def _identity_at_ready(self) -> None:
        """The engine, once READY, reports the version and fingerprint PRECHECK authorized, or the
        difference is evidence in the operation log."""
        report, bundle = self._sup.precheck, self._sup.bundle
        if report is None or report.artifact is None or bundle is None:
            return
        reported = bundle.parts.get("engine_version")
        record = {
            "authorized_fingerprint": report.fingerprint,
            "fingerprint": bundle.fingerprint,
            "authorized_version": report.artifact.version,
            "engine_version": reported,
            "matches": report.fingerprint == bundle.fingerprint,
        }
        self._sup.oplog.append("precheck_identity_at_ready", **record)
        if not record["matches"]:
            self._sup.log(
                f"READY on fingerprint {bundle.fingerprint}, not the {report.fingerprint} PRECHECK "
                f"authorized (engine reports vLLM {reported}, PRECHECK read {report.artifact.version})"
            )

    async def until_ready(self) -> bool:
        """STARTING until READY (True) or a FAILED that nothing here will fix (False)."""
        if not await self.wait_gates():
            return False
        policy = RestartPolicy(
            self._sup.config.startup_restarts,
            self._sup.config.restart_backoff,
            self._sup.config.restart_backoff_cap,
        )
        deadline = time.monotonic() + self._sup.config.startup_timeout
        while True:
            if not await self.authorize():
                return False
            engine = await self._launch_engine()
            exit_task = engine.exit_task()
            ready_task = asyncio.create_task(self._earn_readiness(), name="earn-readiness")
            rank_task = asyncio.create_task(engine.ranks.watch(), name="rank-watch")
            watched: set[asyncio.Task[Any]] = {exit_task, ready_task, rank_task}
            self._sup.watch_preload(watched)
            try:
                await asyncio.wait(
                    watched,
                    timeout=max(0.0, deadline - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for task in watched:
                    task.cancel()
            lost = self._sup.preload_lost()
            if lost is not None and engine.running:  # never READY on weights from a dead daemon
                await engine.stop(min(5.0, self._sup.config.drain.shutdown_timeout))
            rank_loss = engine.ranks.final_loss()
            if rank_loss is not None and engine.running:  # a rank lost before READY: a failed start
                await engine.stop(min(5.0, self._sup.config.drain.shutdown_timeout))
            if ready_task.done() and not ready_task.cancelled() and engine.running:
                exc = ready_task.exception()
                if isinstance(exc, ModelMismatch):
                    await self._sup.stop_engine(self._sup.config.drain.shutdown_timeout, str(exc))
                    self._sup.fail_for_good(str(exc))
                    return False
                if exc is not None:
                    raise exc
                smoke = ready_task.result()
                adapters_failed = await self._reconcile_adapters()
                if adapters_failed is not None:
                    await self._sup.stop_engine(self._sup.config.drain.shutdown_timeout, adapters_failed)
                    self._sup.fail_for_good(adapters_failed)
                    return False
                weights = self._weights_source(engine)
                if weights is not None and weights.problem is not None:
                    await self._sup.stop_engine(self._sup.config.drain.shutdown_timeout, weights.problem)
                    self._sup.fail_for_good(weights.problem, weight_cache=weights.evidence)
                    return False
                artifact = self._sup.precheck.artifact if self._sup.precheck is not None else None
                self._sup.bundle = await read_bundle(
                    self._sup.session,
                    self._sup.config.engine_url,
                    self._sup.config.engine_argv,
                    image=artifact.image if artifact is not None else None,
                    hardware=artifact.hardware if artifact is not None else None,
                    preload=self._sup.config.preload_argv,
                )
                self._sup.oplog.append("bundle", **self._sup.bundle.to_json())
                self._identity_at_ready()
                await self._check_ready_memory()  # the engine's memory, its KV size vs the budget
                self.last_ready = self.launched or self.running_command()
                self._sup.transition(
                    S.READY,
                    "health 200, model listed, smoke completion answered",
                    None,
                    bundle=self._sup.bundle.fingerprint,
                    adapters=list(self._sup.adapters.served),
                    **smoke.to_json(),
                    **({"weights_from": weights.source} if weights is not None else {}),
                )
                return True
            if engine.running:  # the startup deadline passed
                phase = self._sup.machine.sub_state
                reason = (
                    f"engine not ready within --startup-timeout {self._sup.config.startup_timeout:g}s "
                    f"(stuck in {phase})"
                )
                await self._sup.stop_engine(self._sup.config.drain.shutdown_timeout, reason)
                self._sup.fail_for_good(reason, last_lines=list(engine.last_lines()))
                return False
            code = engine.returncode
            self._sup.record_exit(engine)
            await engine.stop(min(5.0, self._sup.config.drain.shutdown_timeout))  # its ranks too
            before_loading = self._sup.machine.sub_state == StartingPhase.ENGINE_STARTING
            if lost is None and (misuse := usage_error(code, before_loading, engine.last_lines())):
                self._sup.fail_for_good(misuse, exit_code=code, last_lines=list(engine.last_lines()))
                return False
            backoff = policy.next_backoff()
            cause = "rank_lost" if rank_loss is not None and lost is None else "startup_exit"
            reason = (
                f"{lost}; engine stopped during startup ({self._sup.machine.sub_state})"
                if lost is not None
                else f"{rank_loss.reason}; during startup ({self._sup.machine.sub_state}), exit code {code}"
                if rank_loss is not None
                else f"engine exited with code {code} during startup ({self._sup.machine.sub_state})"
            )
            words, named = fault_naming(engine, self.graph_nccl_vs_stable)  # a CUDA/NCCL error, an Xid
            reason += words
            if backoff is None or hardware_fault(named):
                spent = (
                    NOT_RESTARTED
                    if hardware_fault(named)
                    else f"--startup-restarts {self._sup.config.startup_restarts} spent"
                )
                self._sup.fail_for_good(
                    f"{reason}; {spent}",
                    exit_code=code,
                    last_lines=list(engine.last_lines()),
                    **named,
                )
                return False
            record = self._sup.record_restart(policy.used, code, reason, backoff, cause=cause, engine=engine)
            self._sup.transition(
                S.STARTING,
                f"{reason}; restarting in {backoff:g}s",
                StartingPhase.RESTARTING,
                **record.to_json(),
                **named,
            )
            await asyncio.sleep(backoff)
            if not await self.wait_gates():
                return False

    def _weights_source(self, engine: EngineProcess) -> PreloadLoad | None:
        """With a preload daemon: where the engine's weights came from, by its log (recorded)."""
        if not self._sup.config.preload_argv:
            return None
        found = verify_preload_load(self._sup.config.engine_argv, engine.weight_cache)
        if found is not None:
            self._sup.oplog.append(
                "preload_verify", source=found.source, problem=found.problem, **found.evidence
            )
        return found

    async def _launch_engine(self) -> EngineProcess:
        env = dict(self._sup.config.engine_env) or None
        if self._sup.engine is not None:
            self._sup.engine.close_xids()
        self.launched = self.running_command()
        publication = self._sup.publication
        engine = EngineProcess(
            self._sup.config.engine_argv,
            publication.engine_line,
            self._on_phase,
            env=env,
            # opened before the start: this run's Xids, on the GPUs it sees
            xids=XidWatch.open(
                self._sup.config.kernel_log, visible=engine_visible_devices(self._sup.config.engine_env)
            ),
            on_xid=publication.xid,
        )
        self._sup.engine = engine
        self._sup.engine_key.key = engine.api_key
        self._sup.transition(
            S.STARTING,
            f"starting engine: {' '.join(redact_argv(self._sup.config.engine_argv))}",
            StartingPhase.ENGINE_STARTING,
        )
        identity = await engine.start()
        self._sup.oplog.append(
            "engine_started",
            pid=identity.pid,
            create_time=identity.create_time,
            argv=redact_argv(self._sup.config.engine_argv),
        )
        return engine

    async def _check_ready_memory(self) -> None:
        """At READY: what the engine's processes hold (NVML), and vLLM's logged KV cache size against
        the memory budget of the last PRECHECK report; a shortfall is engine evidence."""
        sup = self._sup
        engine = sup.engine
        precheck = sup.precheck.to_json() if sup.precheck is not None else None
        if engine is None:
            return
        try:
            figures: EngineFigures | None = await EngineAdmin(sup.session, sup.config.engine_url).figures()
        except AdminCallFailed:
            figures = None
        reading = None
        if not reported(figures):
            visible = engine_visible_devices(sup.config.engine_env)
            reading = await read_device(engine.pid, visible, also=engine.ranks.survivors())
        sup.note_memory("startup", resident_verdict(figures, reading))
        budget = budget_evidence(precheck)
        capacity = capacity_at_ready(engine.log_figures, budget, sup.config.memory)
        sup.memory.note_capacity(capacity, engine.log_figures)
        sup.oplog.append("kv_capacity", **capacity.to_json())
        if capacity.shortfall:
            sup.evidence.note(KV_SHORTFALL, capacity.reason)
            sup.oplog.append("engine_evidence", kind=KV_SHORTFALL, line=capacity.reason)
            sup.metrics.count_evidence(KV_SHORTFALL)

    def _on_phase(self, phase: StartingPhase, line: str) -> None:
        if self._sup.machine.state is S.STARTING and self._sup.machine.sub_state in _ENGINE_PHASES:
            message = line.split("] ", 1)[-1].strip()  # drop vLLM's "(proc) LEVEL time [file]" prefix
            self._sup.transition(S.STARTING, f"engine log: {message[:200]}", phase, line=line[:500])

    async def _earn_readiness(self) -> SmokeResult:
        """Health, then the model list, then the smoke request; retried until they pass."""
        last_error = ""
        while True:
            try:
                await self._sup.readiness.health(self._sup.session)
                if self._sup.machine.sub_state != StartingPhase.SMOKE_TESTING:
                    self._sup.transition(
                        S.STARTING, "engine answers /health 200", StartingPhase.SMOKE_TESTING
                    )
                model = await self._sup.readiness.served_model(self._sup.session)
                smoke = await self._sup.readiness.first_smoke(self._sup.session, model)
            except (EngineNotAnswering, aiohttp.ClientError):
                await asyncio.sleep(0.2)  # still loading: vLLM answers nothing until it is
                continue
            except NotReady as exc:
                if exc.check == "models" and "not the expected" in str(exc):
                    raise ModelMismatch(str(exc)) from exc
                if str(exc) != last_error:
                    self._sup.log(f"not ready yet: {exc}")
                    last_error = str(exc)
                    # in the probe's reason too: what an operator (or a rollout) waiting on it sees
                    self._sup.transition(
                        S.STARTING, f"not ready yet: {exc}"[:300], StartingPhase.SMOKE_TESTING
                    )
                await asyncio.sleep(1.0)
                continue
            self._sup.served_model = model
            self._sup.last_smoke = smoke
            return smoke
