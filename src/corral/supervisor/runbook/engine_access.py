"""What a runbook operation may do to the supervised engine, and nothing more: take the operation
lock, read and set the engine's sleep status, leave and rejoin routing (the drain sequence, then
`resume_serving`), move the state machine, restart the engine in place, switch its bundle, record to
the operation log, and read the configuration, engine session and readiness checks it needs.

`EngineAccess` is the one implementation; the operations name only this Protocol, so mypy
refuses an operation that writes a supervisor attribute or reaches for anything private."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import aiohttp

    from corral.bundle_spec import BundleSpec
    from corral.engine.kv_log import KvCapacity
    from corral.supervisor.checks.adapters import AdapterSet
    from corral.supervisor.checks.bundle import Bundle
    from corral.supervisor.checks.readiness import ReadinessCheck, SmokeResult
    from corral.supervisor.http.admission import AdmissionGate
    from corral.supervisor.lifecycle.config import SupervisorConfig
    from corral.supervisor.lifecycle.drain import DrainSequence
    from corral.supervisor.lifecycle.engine_process import EngineProcess
    from corral.supervisor.lifecycle.memory_checks import MemoryVerdict
    from corral.supervisor.lifecycle.operation_lock import OperationLock
    from corral.supervisor.lifecycle.operations import OperationLedger
    from corral.supervisor.lifecycle.prefix_epoch import PrefixCacheEpoch
    from corral.supervisor.lifecycle.preload import PreloadDaemon
    from corral.supervisor.lifecycle.preload_swap import PreloadMove
    from corral.supervisor.lifecycle.routers import RouterSubscriptions
    from corral.supervisor.lifecycle.sleep_status import SleepStatus
    from corral.supervisor.lifecycle.states import EngineState, StateEvent, StateMachine
    from corral.supervisor.precheck.gate import PrecheckReport
    from corral.supervisor.state.oplog import OperationLog
    from corral.tracing.records import RecordTraces


class EngineAccess(Protocol):
    # -- what an operation reads (read-only: an operation assigns none of these) ---------------------
    @property
    def config(self) -> SupervisorConfig: ...
    @property
    def session(self) -> aiohttp.ClientSession: ...
    @property
    def machine(self) -> StateMachine: ...
    @property
    def readiness(self) -> ReadinessCheck: ...
    @property
    def served_model(self) -> str | None: ...
    @property
    def last_smoke(self) -> SmokeResult | None: ...
    @property
    def engine(self) -> EngineProcess | None: ...
    @property
    def bundle(self) -> Bundle | None: ...
    @property
    def running_bundle(self) -> BundleSpec: ...
    @property
    def adapters(self) -> AdapterSet: ...
    @property
    def routers(self) -> RouterSubscriptions: ...
    @property
    def gate(self) -> AdmissionGate | None: ...
    @property
    def sleep_status(self) -> SleepStatus | None: ...
    @property
    def prefix_cache(self) -> PrefixCacheEpoch: ...
    @property
    def preload(self) -> PreloadDaemon | None: ...
    @property
    def precheck(self) -> PrecheckReport | None: ...  # the last start's PRECHECK (its memory budget)
    @property
    def log(self) -> Callable[[str], None]: ...

    # -- the lock, the ledger, the record -------------------------------------------------------
    @property
    def operation_lock(self) -> OperationLock: ...
    @property
    def operations(self) -> OperationLedger: ...
    @property
    def oplog(self) -> OperationLog: ...
    @property
    def record_traces(self) -> RecordTraces | None: ...  # each change record also a trace, when set

    # -- leaving routing and coming back (lifecycle/drain.py) -----------------------------------
    @property
    def drain_sequence(self) -> DrainSequence: ...
    def resume_serving(self) -> None: ...

    # -- what an operation changes --------------------------------------------------------------
    def transition(
        self, state: EngineState, reason: str, sub_state: str | None = None, /, **evidence: Any
    ) -> StateEvent: ...
    def note_sleep(self, status: SleepStatus | None) -> None: ...
    def note_smoke(self, smoke: SmokeResult) -> None: ...
    def note_memory(self, operation: str, verdict: MemoryVerdict) -> None: ...
    def note_bundle(self, bundle: Bundle) -> None: ...
    def note_kv_capacity(self, capacity: KvCapacity) -> None: ...
    async def restart_in_place(self, reason: str) -> None: ...
    def use_bundle(self, bundle: BundleSpec) -> tuple[str, ...]: ...
    async def move_preload(self, reason: str) -> PreloadMove | None: ...
