"""What the supervisor makes known: each transition, operation and engine log line recorded (operation
log, metrics, its own log), and the `/v1/state` body that shows the whole supervisor at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from corral.child_process import LineSink
from corral.engine import gpu_faults
from corral.engine.evidence import kinds_of
from corral.engine.gpu_faults import GpuFault
from corral.engine.kv_events_address import address_from_argv
from corral.redaction import redact_argv
from corral.supervisor.lifecycle.pd_role import engine_connector, engine_role, pairing_of
from corral.supervisor.lifecycle.states import StateEvent

if TYPE_CHECKING:
    from corral.bundle_spec import BundleSpec
    from corral.engine.evidence import EvidenceBook
    from corral.supervisor.checks.adapters import AdapterSet
    from corral.supervisor.checks.bundle import Bundle
    from corral.supervisor.checks.dependencies import GateWaiter
    from corral.supervisor.lifecycle.config import SupervisorConfig
    from corral.supervisor.lifecycle.drain import DrainReport
    from corral.supervisor.lifecycle.engine_process import EngineProcess, RestartRecord
    from corral.supervisor.lifecycle.failure_strategy import StartupFailure
    from corral.supervisor.lifecycle.memory_checks import MemoryRecord
    from corral.supervisor.lifecycle.metrics import SupervisorMetrics
    from corral.supervisor.lifecycle.operation_lock import OperationLock
    from corral.supervisor.lifecycle.operations import Operation
    from corral.supervisor.lifecycle.prefix_epoch import PrefixCacheEpoch
    from corral.supervisor.lifecycle.routers import RouterSubscriptions
    from corral.supervisor.lifecycle.sleep_status import SleepStatus
    from corral.supervisor.lifecycle.states import StateMachine
    from corral.supervisor.precheck.gate import PrecheckReport
    from corral.supervisor.state.oplog import OperationLog


class _Shown(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class _StableComparison(Protocol):
    def graph_nccl_vs_stable(self) -> dict[str, Any] | None: ...


class PublishedSupervisor(Protocol):
    """What publication reads of the supervisor (`EngineSupervisor`): where it records (operation log,
    metrics, evidence) and every part of it `/v1/state` shows. Read only: publication changes nothing."""

    @property
    def config(self) -> SupervisorConfig: ...
    @property
    def oplog(self) -> OperationLog: ...
    @property
    def metrics(self) -> SupervisorMetrics: ...
    @property
    def evidence(self) -> EvidenceBook: ...
    @property
    def machine(self) -> StateMachine: ...
    @property
    def engine(self) -> EngineProcess | None: ...
    @property
    def served_model(self) -> str | None: ...
    @property
    def bundle(self) -> Bundle | None: ...
    @property
    def running_bundle(self) -> BundleSpec: ...
    @property
    def precheck(self) -> PrecheckReport | None: ...
    @property
    def restarts(self) -> list[RestartRecord]: ...
    @property
    def gates(self) -> GateWaiter: ...
    @property
    def drain_report(self) -> DrainReport | None: ...
    @property
    def routers(self) -> RouterSubscriptions: ...
    @property
    def sleep_status(self) -> SleepStatus | None: ...
    @property
    def prefix_cache(self) -> PrefixCacheEpoch: ...
    @property
    def adapters(self) -> AdapterSet: ...
    @property
    def gate(self) -> _Shown | None: ...  # the admission gate (supervisor/http, above the lifecycle)
    @property
    def idle_sleep(self) -> _Shown | None: ...  # --sleep-after-seconds (runbook/idle_sleep.py)
    @property
    def busy(self) -> str | None: ...
    @property
    def operation_lock(self) -> OperationLock: ...
    @property
    def startup_failure(self) -> StartupFailure | None: ...
    @property
    def startup(self) -> _StableComparison: ...
    @property
    def memory(self) -> MemoryRecord: ...

    def preload_json(self) -> dict[str, Any] | None: ...


class Publication:
    """Records and shows one supervisor's state; it changes nothing."""

    def __init__(self, sup: PublishedSupervisor, log: Callable[[str], None], echo: LineSink) -> None:
        self._sup = sup
        self._log = log
        self._echo = echo
        # the GPU fault of the last engine run that showed one (the most telling kind of that run), with
        # the graph/NCCL settings of that run against the stable bundle's as they were then: kept across
        # restarts and bundle switches, for /v1/state and the operation log (`gpu_fault` records)
        self.last_gpu_fault: dict[str, Any] | None = None

    def event(self, event: StateEvent) -> None:
        sup = self._sup
        sup.metrics.observe(event)
        sup.oplog.append("transition", **{k: v for k, v in event.to_json().items() if k != "type"})
        sub = f"/{event.sub_state}" if event.sub_state else ""
        self._log(f"state {event.to_state}{sub} (epoch {event.epoch}): {event.reason}")

    def operation(self, op: Operation) -> None:
        bundle = self._sup.bundle.fingerprint if self._sup.bundle is not None else None
        self._sup.oplog.append("operation", bundle=bundle, **op.to_json())

    def engine_line(self, line: str) -> None:
        self._echo(line)
        for kind in kinds_of(line):
            self.evidence(kind, line)
        if (fault := gpu_faults.engine_fault(line)) is not None:
            self.gpu_fault(fault)

    def xid(self, fault: GpuFault) -> None:
        """An Xid read for the running engine (kernel log, NVML): evidence, and maybe its last fault."""
        self.evidence("xid", fault.line)
        self.gpu_fault(fault)

    def gpu_fault(self, fault: GpuFault) -> None:
        """A GPU fault the running engine showed (a line, or an Xid read for it): kept as the last one
        when it is the first of its run or more telling than that run's, and recorded then (at most one
        record per kind and run)."""
        engine = self._sup.engine
        pid = engine.pid if engine is not None else None
        last = self.last_gpu_fault
        if last is not None and last.get("engine_pid") == pid:
            kept = GpuFault(str(last["kind"]), "", "")
            if gpu_faults.primary([kept, fault]) is kept:  # as telling as what this run showed already
                return
        compared = self._sup.startup.graph_nccl_vs_stable()  # that run's bundle against the stable one
        self.last_gpu_fault = {
            **fault.to_json(),
            "engine_pid": pid,
            "bundle": compared["bundle"] if compared is not None else self._sup.running_bundle.name,
            "graph_nccl_vs_stable": compared,
        }
        self._sup.oplog.append("gpu_fault", **self.last_gpu_fault)

    def evidence(self, kind: str, line: str) -> None:
        """One line kept as evidence of `kind`: counted, kept in /v1/state and in the operation log."""
        sup = self._sup
        sup.evidence.note(kind, line)
        sup.oplog.append("engine_evidence", kind=kind, line=line[:500])
        sup.metrics.count_evidence(kind)

    def pd_identity(self) -> dict[str, str | None]:
        """The engine's P/D role, pairing identity and KV connector: in /v1/state and on every
        state-stream line."""
        sup = self._sup
        return {
            "role": engine_role(sup.config.engine_argv, sup.config.role),
            "pairing": pairing_of(sup.bundle),
            "connector": engine_connector(sup.config.engine_argv),
        }

    def kv_events(self) -> str | None:
        """Where the engine publishes KV-cache events, `PUB[,REPLAY]` as a router connects to them (its
        --kv-events-config, a wildcard bind read as the engine URL's host): on every state-stream line."""
        sup = self._sup
        address = address_from_argv(sup.config.engine_argv, sup.config.engine_url)
        return address.to_text() if address is not None else None

    def state_body(self) -> dict[str, Any]:
        sup = self._sup
        engine = sup.engine
        return {
            **sup.machine.snapshot(),
            "engine": {
                "url": sup.config.engine_url,
                "pid": engine.pid if engine is not None and engine.running else None,
                "model": sup.served_model or sup.config.model,
                "argv": redact_argv(sup.config.engine_argv),
            },
            "restarts": [r.to_json() for r in sup.restarts],
            "gates": sup.gates.to_json(),
            "drain": sup.drain_report.to_json() if sup.drain_report else None,
            "routers": sup.routers.to_json(),
            "sleep": sup.sleep_status.to_json() if sup.sleep_status is not None else None,
            "idle_sleep": sup.idle_sleep.to_json() if sup.idle_sleep is not None else None,
            "prefix_cache": sup.prefix_cache.to_json(engine),
            "adapters": sup.adapters.to_json(),
            "gate": sup.gate.to_json() if sup.gate is not None else None,
            "preload": sup.preload_json(),
            "busy": sup.busy,
            "operation": sup.operation_lock.in_flight(),  # kind, id, detail, runbook step, since
            "bundle": sup.bundle.to_json() if sup.bundle is not None else None,
            "precheck": sup.precheck.to_json() if sup.precheck is not None else None,
            "bundle_name": sup.running_bundle.name,
            # what POST /v1/bundle accepts: the command as configured, and every --bundle
            "bundles_declared": [sup.config.bundle_name, *(b.name for b in sup.config.bundles)],
            "on_startup_failure": str(sup.config.on_startup_failure),
            "startup_failure": sup.startup_failure.to_json() if sup.startup_failure is not None else None,
            "engine_evidence": sup.evidence.to_json(),
            # the GPU fault the engine's last run showed (CUDA, NCCL, an Xid), named; None when none
            "gpu_fault": engine.gpu_fault() if engine is not None else None,
            # the last run that showed one: its fault and its graph/NCCL settings against the stable bundle's
            "last_gpu_fault": self.last_gpu_fault,
            # where the driver's Xids are read from (kernel log, NVML), and why not from the others
            "xid_sources": engine.xid_sources() if engine is not None else None,
            # its CUDA-graph/NCCL settings against the stable bundle's (None without another bundle)
            "graph_nccl_vs_stable": sup.startup.graph_nccl_vs_stable(),
            # the engine's logged KV cache size, and the last memory verdict (lifecycle/device_memory.py)
            "kv_cache_tokens": engine.log_figures.kv_cache_tokens if engine is not None else None,
            "memory": sup.memory.to_json(),
            # the engine's worker ranks (pid, liveness) and the world size its command asks for
            **(engine.ranks.to_json() if engine is not None else {"world_size": None, "ranks": []}),
            **self.pd_identity(),
            "kv_events": self.kv_events(),
        }
