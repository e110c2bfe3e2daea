"""The supervisor's own Prometheus metrics (`/metrics`): current state, transitions, engine restarts,
gate waits, the epoch, the preload daemon's events (disk fallbacks, deaths, restarts) and failed
state-dir writes, in a registry of its own so that nothing is shared between instances."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from corral.supervisor.lifecycle.states import EngineState, StateEvent


class SupervisorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.state = Gauge(
            "corral_supervisor_state",
            "1 for the engine's current lifecycle state, 0 for the others.",
            ["state"],
            registry=self.registry,
        )
        self.ready = Gauge(
            "corral_supervisor_ready", "1 when the engine is READY (readiness true).", registry=self.registry
        )
        self.epoch = Gauge(
            "corral_supervisor_epoch", "Epoch of the latest state event.", registry=self.registry
        )
        self.transitions = Counter(
            "corral_supervisor_transitions",
            "State events by from/to state (sub-state changes count as from == to).",
            ["from_state", "to_state"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "corral_supervisor_engine_restarts",
            "Engine restarts in place, by cause (startup exit, stall, exit while serving).",
            ["cause"],
            registry=self.registry,
        )
        self.not_answering = Counter(
            "corral_supervisor_not_answering",
            "Times a READY engine was withdrawn from routing because /health stopped answering "
            "(DRAINING/not_answering; --unanswered-seconds).",
            registry=self.registry,
        )
        self.gate_wait = Gauge(
            "corral_supervisor_gate_wait_seconds",
            "Seconds spent waiting for each dependency gate (so far, or until it opened).",
            ["gate"],
            registry=self.registry,
        )
        self.gate_open = Gauge(
            "corral_supervisor_gate_open",
            "1 once the dependency gate has opened.",
            ["gate"],
            registry=self.registry,
        )
        self.preload_fallbacks = Counter(
            "corral_supervisor_preload_fallbacks",
            "Engine weight loads that fell back to disk because the preload daemon was unusable.",
            registry=self.registry,
        )
        self.preload_exits = Counter(
            "corral_supervisor_preload_exits",
            "Preload daemon exits the supervisor did not ask for.",
            registry=self.registry,
        )
        self.preload_restarts = Counter(
            "corral_supervisor_preload_restarts",
            "Preload daemon restarts after it died.",
            registry=self.registry,
        )
        self.state_write_errors = Counter(
            "corral_supervisor_state_write_errors",
            "Failed writes (and fsyncs) of state-dir files, by file and errno name; /livez is false "
            "while a file cannot be written.",
            ["file", "error"],
            registry=self.registry,
        )
        for state in EngineState:
            self.state.labels(state=state.value).set(0)

    def observe(self, event: StateEvent) -> None:
        for state in EngineState:
            self.state.labels(state=state.value).set(1 if state is event.to_state else 0)
        self.ready.set(1 if event.ready else 0)
        self.epoch.set(event.epoch)
        if event.from_state is not None:
            self.transitions.labels(from_state=event.from_state.value, to_state=event.to_state.value).inc()

    def count_evidence(self, kind: str) -> None:
        """An engine log line classified as evidence (`corral.engine.evidence`)."""
        if kind == "fallback":
            self.preload_fallbacks.inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
