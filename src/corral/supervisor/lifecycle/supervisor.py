"""`EngineSupervisor`: drives one engine through the lifecycle — gates, start, restart in place,
earned readiness, stall watch, drain, stop — recording each step in the state machine and the
operation log. The HTTP surface lives in `api.py`; this module owns what happens and in which order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from corral.aio import cancel_tasks
from corral.bundle_spec import BundleSpec
from corral.child_process import LineSink
from corral.contracts.traffic import RequestCounts
from corral.engine.evidence import KV_SHORTFALL, EvidenceBook
from corral.engine.kv_log import EngineLogFigures, KvCapacity
from corral.redaction import redact_argv
from corral.supervisor.checks.adapters import AdapterSet
from corral.supervisor.checks.bundle import Bundle
from corral.supervisor.checks.dependencies import GateWaiter
from corral.supervisor.checks.engine_auth import EngineKey
from corral.supervisor.checks.readiness import ReadinessCheck, SmokeResult
from corral.supervisor.checks.stall import Stall, StallWatch
from corral.supervisor.lifecycle.asleep_ranks import AsleepRankWatch
from corral.supervisor.lifecycle.config import SupervisorConfig
from corral.supervisor.lifecycle.drain import DrainPolicy, DrainReport, DrainSequence, DrainSettings
from corral.supervisor.lifecycle.drain_record import bundle_of, drain_change_record
from corral.supervisor.lifecycle.drain_transfers import TransferSide
from corral.supervisor.lifecycle.engine_process import EngineProcess, RestartPolicy, RestartRecord
from corral.supervisor.lifecycle.failure_strategy import RollbackStarter, StartupFailure, Verdict, decide
from corral.supervisor.lifecycle.fault_naming import NOT_RESTARTED, hardware_fault, with_gpu_fault
from corral.supervisor.lifecycle.forced_exits import RequestWatch
from corral.supervisor.lifecycle.idle_settings import IdleSleepView
from corral.supervisor.lifecycle.leftover_scene import EngineSnapshot, stopped_leftovers
from corral.supervisor.lifecycle.memory_checks import MemoryRecord, MemoryVerdict
from corral.supervisor.lifecycle.metrics import SupervisorMetrics
from corral.supervisor.lifecycle.not_answering import NotAnswering
from corral.supervisor.lifecycle.operation_lock import OperationLock
from corral.supervisor.lifecycle.operations import Operation, OperationLedger
from corral.supervisor.lifecycle.prefix_epoch import PrefixCacheEpoch
from corral.supervisor.lifecycle.preload import PreloadDaemon
from corral.supervisor.lifecycle.preload_recovery import PreloadKeeper
from corral.supervisor.lifecycle.preload_swap import PreloadMove, move_daemon
from corral.supervisor.lifecycle.publication import Publication
from corral.supervisor.lifecycle.routers import RouterSubscriptions
from corral.supervisor.lifecycle.sleep_status import SleepStatus
from corral.supervisor.lifecycle.startup import EngineStartup
from corral.supervisor.lifecycle.states import (
    EngineState,
    StartingPhase,
    StateEvent,
    StateMachine,
)
from corral.supervisor.state.oplog import EngineLeftover, OperationLog, last_epoch
from corral.supervisor.state.runtime_adapters import RuntimeAdapterFile, restore_runtime_adapters
from corral.supervisor.state.state_writes import StateWriteFailures
from corral.tracing.records import RecordTraces

if TYPE_CHECKING:
    from corral.supervisor.http.admission import AdmissionGate  # set by the CLI; lifecycle never builds one
    from corral.supervisor.precheck.gate import PrecheckReport

S = EngineState
Log = Callable[[str], None]


class EngineSupervisor:
    def __init__(self, config: SupervisorConfig, log: Log, echo: LineSink) -> None:
        self.config = config
        self._log = log
        self.log = log
        self._echo = echo
        self.metrics = SupervisorMetrics()
        self.state_writes = StateWriteFailures(self.metrics.state_write_errors, log)
        self.oplog = OperationLog(
            config.state_dir, self.state_writes, config.oplog_max_bytes, config.oplog_keep
        )
        # set by serve() when traces are exported: each change record is also a trace
        self.record_traces: RecordTraces | None = None
        self.machine = StateMachine()  # replaced in open(), once the log gives the next epoch
        self.gates = GateWaiter(config.gates, config.dependency_timeout, self.gate_log)
        # READY needs every rank too (after a start or a wake): what the running engine's ranks lack
        self.readiness = ReadinessCheck(config.engine_url, config.model, ranks=self._ranks_missing)
        self.publication = Publication(self, log, echo)
        self.operations = OperationLedger(self.publication.operation)
        self.routers = RouterSubscriptions(self.oplog.append, log)
        self.engine: EngineProcess | None = None
        self.restarts: list[RestartRecord] = []
        self.served_model: str | None = None
        self.last_smoke: SmokeResult | None = None
        self.bundle: Bundle | None = None
        self.precheck: PrecheckReport | None = None  # the last PRECHECK (startup.authorize); /v1/state
        self.evidence = EvidenceBook()
        self.memory = MemoryRecord()  # the last memory verdict and the KV capacity check (/v1/state)
        self.unrecoverable: str | None = None
        # the last start that failed for good and what --on-startup-failure made of it; the rollback
        # operation's starter is set by the composition root (the runbook is above the lifecycle)
        self.startup_failure: StartupFailure | None = None
        self.start_rollback: RollbackStarter | None = None
        self.rolled_back = False
        self._base_argv = config.engine_argv  # the command as configured; a bundle adds to or replaces it
        self._base_preload = config.preload_argv  # the daemon as configured; a bundle may name its own
        self.running_bundle = BundleSpec(name=config.bundle_name)
        self.drain_report: DrainReport | None = None
        # what the engine's sleep is (set through note_sleep), and which runbook operation holds the
        # engine now (one at a time); the operations reach both through runbook/engine_access.py
        self.sleep_status: SleepStatus | None = None
        self.prefix_cache = PrefixCacheEpoch()  # its token rides on every state line (the watch)
        self.operation_lock = OperationLock()
        self.adapters = AdapterSet(desired=dict(config.lora))
        self.preload: PreloadDaemon | None = None  # set when --preload-command runs the daemon
        self._preload: PreloadKeeper | None = None
        self.gate: AdmissionGate | None = None  # set when --gate-port serves the data path
        # set by the composition root when --sleep-after-seconds asks for idle sleep (runbook/idle_sleep.py)
        self.idle_sleep: IdleSleepView | None = None
        self.stall_watch: StallWatch | None = None
        self.answer_watch: NotAnswering | None = None  # READY ⇄ DRAINING/not_answering (--unanswered-seconds)
        self.exit_requested = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self.engine_key = EngineKey(config.engine_url)  # the running engine's --api-key, on our calls to it
        self._lifecycle: asyncio.Task[None] | None = None
        self._asleep_watch: asyncio.Task[None] | None = None  # the ranks of a SLEEPING engine
        self._drain: asyncio.Task[DrainReport] | None = None
        self.drain_sequence = DrainSequence(self, log)
        self.startup = EngineStartup(self)

    # -- set-up and tear-down -------------------------------------------------------------------

    async def open(self) -> None:
        """Lock the state dir, continue its epochs, and make sure no engine from before still runs."""
        records = self.oplog.open()
        self.machine = StateMachine(
            first_epoch=last_epoch(records) + 1,
            reason="supervisor started",
            sub_state=StartingPhase.WAITING_DEPENDENCIES,
        )
        self.machine.subscribe(self.publication.event)
        self.machine.subscribe(self.routers.note_event)
        self.oplog.append("supervisor_started", argv=redact_argv(self.config.engine_argv))
        store = RuntimeAdapterFile(self.config.state_dir, self.state_writes)
        runtime, unreadable = restore_runtime_adapters(store, dict(self.config.lora), self._log)
        self.adapters.restore(runtime, store)
        self.oplog.append("runtime_adapters_restored", adapters=runtime, error=unreadable)
        leftover = EngineLeftover.from_records(records)
        if leftover is not None:
            pids = await leftover.kill(self.config.drain.shutdown_timeout)
            verdict = "killed" if pids else "already gone"
            self._log(
                f"engine pid {leftover.pid} from a previous supervisor: {verdict}"
                + (f" (processes {pids})" if pids else "")
            )
            self.oplog.append(
                "engine_exited", pid=leftover.pid, exit_code=None, leftover=True, killed_pids=pids
            )
        # No keep-alive to the engine: an idle connection of ours must never be what keeps a
        # shutting-down engine waiting "for connections to close".
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), middlewares=(self.engine_key,)
        )

    async def close(self) -> None:
        await cancel_tasks(self._lifecycle, self._asleep_watch)
        stopping = await EngineSnapshot.take(self.engine)  # what must be gone once all is stopped
        if self.engine is not None:  # an engine that exited may still leave ranks: the stop ends them
            await self.stop_engine(self.config.drain.shutdown_timeout, "supervisor exiting")
        if self.preload is not None:  # only after the engine, which may map the daemon's memory
            await self.preload.stop(self.config.drain.shutdown_timeout, self.oplog.append)
        if self._session is not None:
            await self._session.close()
        left = await stopped_leftovers(self.config, self.preload, stopping)
        self.oplog.append("leftovers", operation="shutdown", **left.to_wire())
        if left.failures or left.warnings:
            self._log(f"shutdown left: {left.named()}")
        self.oplog.append("supervisor_exited")
        self.oplog.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "open() first"
        return self._session

    @property
    def engine_url(self) -> str:
        return self.config.engine_url

    @property
    def drain_settings(self) -> DrainSettings:
        """The configured drain, with the running engine's KV transfer role (from its command line)."""
        side = TransferSide.of_command(self.config.engine_argv)
        return dataclasses.replace(self.config.drain, transfers=side)

    @property
    def engine_running(self) -> bool:
        return self.engine is not None and self.engine.running

    @property
    def request_watch(self) -> RequestWatch | None:
        """The gate's in-flight requests, whose forced exits a drain names (None: no gate)."""
        return self.gate.requests if self.gate is not None else None

    def start(self) -> None:
        self._lifecycle = asyncio.create_task(self._run_lifecycle(), name="lifecycle")
        self._lifecycle.add_done_callback(self._lifecycle_ended)
        if self._asleep_watch is None:  # one for the supervisor's life, whatever restarts
            watch = AsleepRankWatch(self, self._log)
            self._asleep_watch = asyncio.create_task(watch.run(), name="asleep-rank-watch")
            self._asleep_watch.add_done_callback(self._lifecycle_ended)

    def _lifecycle_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self._log(f"lifecycle crashed (a bug; /livez now fails): {type(exc).__name__}: {exc}")

    @property
    def live(self) -> tuple[bool, str]:
        """Liveness: false only for a failure nothing here will recover from (never for slow loading)."""
        if self._lifecycle is not None and self._lifecycle.done() and not self._lifecycle.cancelled():
            exc = self._lifecycle.exception()
            if exc is not None:
                return False, f"supervisor lifecycle crashed: {type(exc).__name__}: {exc}"
        if self.unrecoverable is not None:
            return False, self.unrecoverable
        if (unwritable := self.state_writes.problem) is not None:
            return False, unwritable
        if self.held_unready:
            return True, "start failed; held unready for a person (--on-startup-failure stay-unready)"
        return True, "supervisor loop alive; engine running or legitimately starting"

    @property
    def held_unready(self) -> bool:
        """A start failed and --on-startup-failure stay-unready holds the engine FAILED for a person:
        /livez and /startupz answer 200 so that no probe restarts the pod."""
        return self.machine.state is S.FAILED and self.machine.sub_state == Verdict.STAY_UNREADY

    # -- recording ------------------------------------------------------------------------------

    def refresh_gate_metrics(self) -> None:
        for status in self.gates.status.values():
            self.metrics.gate_wait.labels(gate=status.spec).set(status.waited_seconds)
            self.metrics.gate_open.labels(gate=status.spec).set(1 if status.open else 0)

    def gate_log(self, message: str) -> None:
        self.refresh_gate_metrics()
        self._log(message)

    # -- the preload daemon (what follows its death: corral.supervisor.lifecycle.preload_recovery) --------

    async def start_preload(self, daemon: PreloadDaemon) -> None:
        """Run the weight-cache daemon, before the lifecycle starts the engine, and hear of its death."""
        self.preload = daemon
        self._preload = PreloadKeeper(
            daemon,
            self.config,
            self.metrics,
            self.evidence,
            self.oplog.append,
            self._log,
            lambda: self.machine.state.value,
        )
        await self._preload.start()

    def preload_lost(self) -> str | None:
        return self._preload.lost if self._preload is not None else None

    def watch_preload(self, tasks: set[asyncio.Task[Any]]) -> None:
        if self._preload is not None:
            tasks.add(self._preload.death_task())

    async def revive_preload(self) -> bool:
        """Before the engine (re)starts, a dead daemon runs again; False once it keeps dying."""
        lost = self.preload_lost()
        if self._preload is None or lost is None:
            return True
        self._to(S.STARTING, f"restarting the preload daemon: {lost}", StartingPhase.WAITING_DEPENDENCIES)
        problem = await self._preload.revive(self.session)
        if problem is not None:
            self.fail_for_good(problem, preload=self.preload_json())
            return False
        return True

    def _to(
        self, state: EngineState, reason: str, sub_state: str | None = None, /, **evidence: Any
    ) -> StateEvent:
        return self.machine.transition(state, reason, sub_state, evidence)

    # -- the lifecycle --------------------------------------------------------------------------

    async def _run_lifecycle(self, serving: bool = False) -> None:
        recovery = RestartPolicy(
            self.config.failure_restarts, self.config.restart_backoff, self.config.restart_backoff_cap
        )
        while True:
            if not serving and not await self.startup.until_ready():
                await self._roll_back_if_decided()
                return
            serving = False
            # named by the GPU fault behind it (a CUDA/NCCL error logged, an Xid), where there is one
            failure = with_gpu_fault(await self._serve(), self.engine, self.startup.graph_nccl_vs_stable)
            self._to(S.FAILED, failure.reason, None, **failure.evidence)
            await self.stop_engine(min(5.0, self.config.drain.shutdown_timeout), failure.reason)
            if hardware_fault(failure.evidence):  # a new engine on the same GPU fails again
                self.fail_for_good(f"{failure.reason}; {NOT_RESTARTED}")
                return
            backoff = recovery.next_backoff()
            if backoff is None:
                self.fail_for_good(
                    f"{failure.reason}; restart budget spent "
                    f"({self.config.failure_restarts} restarts after failures)"
                )
                return
            cause = "preload_exit" if self.preload_lost() else "failure"
            if failure.evidence.get("source") == "rank_watch":
                cause = "rank_lost"
            self.record_restart(recovery.used, None, failure.reason, backoff, cause=cause, engine=self.engine)
            await asyncio.sleep(backoff)
            self._to(
                S.STARTING,
                f"restarting in place after: {failure.reason}",
                StartingPhase.RESTARTING,
                attempt=recovery.used,
            )

    # -- what the runbook operations (corral.supervisor.runbook) drive ------------------------------

    def transition(
        self, state: EngineState, reason: str, sub_state: str | None = None, /, **evidence: Any
    ) -> StateEvent:
        return self._to(state, reason, sub_state, **evidence)

    @property
    def busy(self) -> str | None:
        return self.operation_lock.holder

    def note_sleep(self, status: SleepStatus | None) -> None:
        """What the engine's sleep is now; None once it is awake (or restarted)."""
        self.sleep_status = status

    def note_smoke(self, smoke: SmokeResult) -> None:
        self.last_smoke = smoke

    def note_memory(self, operation: str, verdict: MemoryVerdict) -> None:
        """A memory verdict of VERIFY (passed, failed or not_measured), shown and recorded."""
        self.oplog.append("memory_verified", **self.memory.note(operation, verdict))

    def note_bundle(self, bundle: Bundle) -> None:
        """The bundle the engine serves now, read again after its weights changed in place (a reload)."""
        self.bundle = bundle
        self.oplog.append("bundle", **bundle.to_json())

    def note_kv_capacity(self, capacity: KvCapacity) -> None:
        """vLLM's logged KV size against the budget (at READY, and again after a reload): shown in
        `/v1/state`, recorded, and a shortfall is engine evidence."""
        logged = self.engine.log_figures if self.engine is not None else EngineLogFigures()
        self.memory.note_capacity(capacity, logged)
        self.oplog.append("kv_capacity", **capacity.to_json())
        if capacity.shortfall:
            self.evidence.note(KV_SHORTFALL, capacity.reason)
            self.oplog.append("engine_evidence", kind=KV_SHORTFALL, line=capacity.reason)
            self.metrics.count_evidence(KV_SHORTFALL)

    async def suspend_lifecycle(self) -> None:
        """Stop the READY watch (stall detection) while an operation has the engine out of routing."""
        await cancel_tasks(self._lifecycle)
        self._lifecycle = None

    def resume_serving(self) -> None:
        """The engine is READY again after an operation: watch it as after startup."""
        self._lifecycle = asyncio.create_task(self._run_lifecycle(serving=True), name="lifecycle")
        self._lifecycle.add_done_callback(self._lifecycle_ended)

    def use_bundle(self, bundle: BundleSpec) -> tuple[str, ...]:
        """The engine's next start runs `bundle`: its command and environment (the switch_bundle op)."""
        argv = bundle.argv(self._base_argv)
        self.config = dataclasses.replace(
            self.config,
            engine_argv=argv,
            engine_env=tuple(bundle.env.items()),
            preload_argv=bundle.preload_argv(self._base_preload),
        )
        self.running_bundle = bundle
        self.unrecoverable = None  # a failure of the previous command says nothing of this one
        self.oplog.append("bundle_selected", name=bundle.name, argv=redact_argv(argv), env=sorted(bundle.env))
        return argv

    async def move_preload(self, reason: str) -> PreloadMove | None:
        """After `use_bundle`: the selected bundle's daemon runs before its engine starts. The running
        daemon is kept when its command and vLLM version are the bundle's; else the engine stops, then
        the daemon, and the bundle's daemon must answer its health (lifecycle/preload_swap.py). None
        without a daemon."""
        if self.preload is None:
            return None
        await self.suspend_lifecycle()
        grace = min(5.0, self.config.drain.shutdown_timeout)

        async def stop_engine() -> None:
            await self.stop_engine(grace, f"{reason}: the preload daemon is replaced")
            self._to(
                S.STARTING,
                f"{reason}: starting the bundle's preload daemon (its cache rebuilt from disk)",
                StartingPhase.WAITING_DEPENDENCIES,
            )

        move = await move_daemon(
            self.preload,
            self.config.preload_argv,
            stop_engine=stop_engine,
            session=self.session,
            within=self.config.dependency_timeout,
            grace=self.config.drain.shutdown_timeout,
            record=self.oplog.append,
        )
        self._log(
            f"preload daemon {'replaced' if move.replaced else 'kept'} ({move.why})"
            + (f": {move.problem}" if move.problem else "")
        )
        return move

    async def restart_in_place(self, reason: str) -> None:
        """RECOVER's last resort: stop the engine and start it afresh (weights from disk, a known state)."""
        await self.suspend_lifecycle()
        await self.stop_engine(min(5.0, self.config.drain.shutdown_timeout), reason)
        self.sleep_status = None
        self._to(S.STARTING, f"restarting in place after: {reason}", StartingPhase.RESTARTING)
        self.start()

    async def fail_asleep(self, reason: str, evidence: dict[str, Any]) -> None:
        """A SLEEPING engine lost a rank (or exited): FAILED naming it, then a restart in place."""
        self._to(S.FAILED, reason, None, recoverable=True, **evidence)
        cause = "rank_lost" if evidence.get("source") == "rank_watch" else "failure"
        code = self.engine.returncode if self.engine is not None else None
        self.record_restart(len(self.restarts) + 1, code, reason, 0.0, cause=cause, engine=self.engine)
        await self.restart_in_place(reason)

    def _ranks_missing(self) -> str | None:
        """What keeps the running engine's ranks from being whole (readiness asks: READY needs all)."""
        return self.engine.ranks.missing() if self.engine is not None else None

    def fail_for_good(self, reason: str, **evidence: Any) -> None:
        """Nothing here will fix it. A start that fails (from STARTING) gets the --on-startup-failure
        verdict (lifecycle/failure_strategy.py); anything else gives up."""
        verdict = Verdict.GAVE_UP
        if self.machine.state is S.STARTING:
            choice = self.config.on_startup_failure
            verdict = decide(choice, rolled_back=self.rolled_back, operation=self.busy)
            if verdict is Verdict.ROLLING_BACK and self.start_rollback is None:
                verdict = Verdict.GAVE_UP  # nothing to run the rollback with (a supervisor without an API)
            self.startup_failure = StartupFailure(self.running_bundle.name, reason, verdict, choice)
            evidence = {**evidence, "on_startup_failure": str(choice)}
        if verdict is Verdict.GAVE_UP:
            self.unrecoverable = reason
        self.rolled_back = self.rolled_back or verdict is Verdict.ROLLING_BACK
        self._to(S.FAILED, reason, verdict.value, recoverable=False, **evidence)

    async def _roll_back_if_decided(self) -> None:
        failure = self.startup_failure
        if self.machine.sub_state != Verdict.ROLLING_BACK or failure is None or self.start_rollback is None:
            return
        problem = await self.start_rollback(failure)
        if problem is not None:
            bundle = failure.choice.bundle
            self.fail_for_good(f"{failure.reason}; the rollback to {bundle} could not start: {problem}")

    async def _serve(self) -> Stall:
        """While READY: returns the first sign that the engine can no longer serve."""
        engine = self.engine
        assert engine is not None and self.served_model is not None
        watch = StallWatch(
            self.session, self.config.engine_url, self.readiness, self.served_model, self.config.stall_seconds
        )
        self.stall_watch = watch
        exit_task = engine.exit_task()
        stall_task = asyncio.create_task(watch.watch(), name="stall-watch")
        rank_task = asyncio.create_task(engine.ranks.watch(), name="rank-watch")
        watched: set[asyncio.Task[Any]] = {exit_task, stall_task, rank_task}
        answer_task: asyncio.Task[Any] | None = None
        if self.config.unanswered_seconds > 0:  # withdraws and restores; failing stays the stall rule's
            self.answer_watch = NotAnswering(self, self.config.unanswered_seconds, self._log)
            answer_task = asyncio.create_task(self.answer_watch.run(), name="answer-watch")
            watched.add(answer_task)
        self.watch_preload(watched)
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in watched:
                task.cancel()
        if answer_task is not None and answer_task.done() and not answer_task.cancelled():
            answer_task.result()  # it never returns: only a bug ends it, and the lifecycle shows it
        lost = self.preload_lost()
        if lost is not None and engine.running:  # its weights may be the dead daemon's memory
            return Stall(f"{lost} while serving", {"preload": self.preload_json()})
        # a rank lost (process gone, or a rank/collective failure logged) names the cause even when
        # the engine exited since: vLLM shuts down after it, and its exit code says less
        if (rank_loss := engine.ranks.final_loss()) is not None:
            if not engine.running:
                self.record_exit(engine)
            return Stall(rank_loss.reason, {**rank_loss.evidence, "exit_code": engine.returncode})
        if stall_task.done() and not stall_task.cancelled() and engine.running:
            return stall_task.result()
        self.record_exit(engine)
        return Stall(
            f"engine exited with code {engine.returncode} while serving",
            {"exit_code": engine.returncode, "last_lines": list(engine.last_lines())},
        )

    def note_not_answering(self, withdrawn: bool) -> None:
        """The answer watch withdrew the engine from routing (True) or earned it back (False); the
        transition itself is in the operation log."""
        if withdrawn:
            self.metrics.not_answering.inc()

    def record_exit(self, engine: EngineProcess) -> None:
        if engine.identity is not None:
            self.oplog.append(
                "engine_exited",
                pid=engine.identity.pid,
                exit_code=engine.returncode,
                last_lines=list(engine.last_lines()),
            )

    def record_restart(
        self,
        attempt: int,
        code: int | None,
        reason: str,
        backoff: float,
        cause: str,
        engine: EngineProcess | None = None,
    ) -> RestartRecord:
        last = engine.last_lines() if engine is not None else ()
        record = RestartRecord(attempt, code, reason, last, backoff)
        self.restarts.append(record)
        self.metrics.restarts.labels(cause=cause).inc()
        self.oplog.append("engine_restart", cause=cause, **record.to_json())
        self._log(f"restart {attempt} in {backoff:g}s: {reason}")
        return record

    async def stop_engine(self, grace: float, reason: str) -> int | None:
        engine = self.engine
        if engine is None or engine.pid is None:
            return None
        was_running = engine.running
        code = await engine.stop(grace)
        if was_running:
            self._log(f"engine stopped (exit code {code}): {reason}")
            self.record_exit(engine)
        return code

    # -- drain and shutdown ---------------------------------------------------------------------

    def request_drain(self, op_id: str | None, policy: DrainPolicy | None = None) -> tuple[Operation, bool]:
        return self.operations.start("drain", op_id, lambda op: self._drain_op(op, policy))

    def request_shutdown(
        self, op_id: str | None, reason: str = "shutdown requested"
    ) -> tuple[Operation, bool]:
        return self.operations.start("shutdown", op_id, lambda op: self._shutdown_op(op, reason))

    async def _drain_op(self, op: Operation, policy: DrainPolicy | None) -> dict[str, Any]:
        counts = self.gate.counts() if self.gate is not None else None
        return self._drained(op, await self.drain(policy), counts)

    async def _shutdown_op(self, op: Operation, reason: str) -> dict[str, Any]:
        self._log(f"shutdown: {reason}")
        counts = self.gate.counts() if self.gate is not None else None
        try:
            return self._drained(op, await self.drain(None), counts)
        finally:  # whatever went wrong in the drain, a shutdown asked for is a shutdown done
            self.exit_requested.set()

    def _drained(self, op: Operation, report: DrainReport, counts: RequestCounts | None) -> dict[str, Any]:
        """The drain report as the operation's result, with its change record (in the oplog too)."""
        after = self.gate.counts() if self.gate is not None else None
        bundle = bundle_of(self.running_bundle, self.bundle)
        record = drain_change_record(op, report, self.config.engine_url, bundle, counts, after)
        self.oplog.append("change_record", **record.to_file())
        return {**report.to_json(), "change_record": record.to_file()}

    def on_signal(self, sig: signal.Signals) -> None:
        self.request_shutdown(f"signal-{sig.name}", f"received {sig.name}")

    async def drain(self, policy: DrainPolicy | None) -> DrainReport:
        """One drain per supervisor life: later callers join the first."""
        if self._drain is None:
            self._drain = asyncio.create_task(self._run_drain(policy), name="drain")
        return await asyncio.shield(self._drain)

    async def _run_drain(self, policy: DrainPolicy | None) -> DrainReport:
        report = await self.drain_sequence.drain_and_stop(policy or self.config.drain.policy)
        self.drain_report = report
        return report

    # -- what the API shows ---------------------------------------------------------------------

    def preload_json(self) -> dict[str, Any] | None:
        return self.preload.to_json() if self.preload is not None else None

    def state_body(self) -> dict[str, Any]:
        return self.publication.state_body()
