"""Every number in the rendered manifests that is a time or a count, derived from the config by a named
formula: the startup budget (the longest legal load), the startup probe that covers it, the drain and
the termination grace period that covers it, and the rolling update's surge and unavailability from
spare GPUs. The functions are pure; `derive` applies them to one config and keeps each step's
arithmetic so `corral k8s render --explain` can show it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from corral.k8s.render.config import CorralDeployment
from corral.supervisor_defaults import RESTART_BACKOFF_CAP_SECONDS

GIB = 2**30
GB = 10**9

# Pod Ready=False reaching the router: the API server's watch event and the router applying it.
ROUTER_WATCH_SECONDS = 5.0
# `corral supervise prestop` makes HTTP calls with a 10 s client timeout; one may be in flight at the end.
PRESTOP_SLACK_SECONDS = 10.0
# After SIGTERM the supervisor, its drain already done, closes its HTTP server (2 s) and its log.
EXIT_SLACK_SECONDS = 10.0
# A router pod keeps serving this long after termination starts, while its Service endpoint is removed.
ROUTER_LEAVE_SECONDS = 5
# Deployment progress: a new pod may legally take the whole startup window before it counts as progress.
PROGRESS_SLACK_SECONDS = 60


def transfer_seconds(gib: float, gb_per_second: float) -> float:
    """Seconds to move `gib` GiB at `gb_per_second` GB/s: gib × 2^30 bytes ÷ (rate × 10^9 bytes/s).
    Sizes are in GiB (what `du -sh` shows), rates in GB/s (what disks and links are sold in)."""
    return gib * GIB / (gb_per_second * GB)


def load_attempt_seconds(
    read_s: float,
    process_start_s: float,
    quantization_s: float,
    compile_s: float,
    graph_capture_s: float,
    warmup_s: float,
    smoke_s: float,
) -> float:
    """One engine start from process launch to the supervisor's smoke answer, without download: the
    phases run one after another, so the attempt is their sum."""
    return read_s + process_start_s + quantization_s + compile_s + graph_capture_s + warmup_s + smoke_s


def backoff_schedule(
    restarts: int, initial_s: float, cap_s: float = RESTART_BACKOFF_CAP_SECONDS
) -> tuple[float, ...]:
    """The supervisor's delays before each startup restart: initial × 2^i for i < restarts, each capped
    (the same rule as `corral.supervisor.lifecycle.engine_process.RestartPolicy`)."""
    return tuple(min(cap_s, initial_s * 2.0**i) for i in range(restarts))


def startup_timeout_seconds(
    download_s: float, attempt_s: float, restarts: int, backoffs: tuple[float, ...], margin: float
) -> int:
    """The supervisor's --startup-timeout, one deadline across all in-place restarts:
    ceil(margin × (download + (1 + restarts) × attempt) + Σ backoffs). The download happens once (a
    restart finds the files cached); every allowed restart gets a full load, else a restart near the
    end of a load could never finish, and the margin covers a slower-than-declared disk or GPU."""
    return math.ceil(margin * (download_s + (1 + restarts) * attempt_s) + sum(backoffs))


def startup_window_seconds(
    dependency_s: float, startup_timeout_s: float, restarts: int, max_backoff_s: float, shutdown_s: float
) -> float:
    """How long the supervisor may legally stay STARTING before it gives up by itself:
    dependency + startup_timeout + shutdown + (restarts > 0: max_backoff + dependency).
    The gates are waited for first (up to the dependency timeout); the startup deadline then runs; an
    engine that misses it is stopped (up to the shutdown timeout). A restart that begins just before
    the deadline sleeps its backoff and waits for the gates again, past the deadline, once.
    `dependency_s` is 0 when nothing is declared."""
    overshoot = max_backoff_s + dependency_s if restarts > 0 else 0.0
    return dependency_s + startup_timeout_s + shutdown_s + overshoot


def probe_failure_threshold(window_s: float, period_s: int) -> int:
    """failureThreshold so that the probe cannot fail the container inside `window_s`: the first probe
    runs at about t=0 and the kubelet acts on the failureThreshold-th failure in a row, at
    (threshold − 1) × period, so threshold = ceil(window / period) + 1 (in whole seconds, as probes
    count them)."""
    whole = math.ceil(window_s)
    return -(-whole // period_s) + 1


def readiness_detection_seconds(period_s: int, failure_threshold: int) -> int:
    """How long after /readyz turns 503 the kubelet marks the pod NotReady: period × failureThreshold."""
    return period_s * failure_threshold


def propagation_timeout_seconds(detection_s: float, quiet_s: float) -> float:
    """The supervisor's --propagation-timeout when the config leaves it out, sized for the slowest way
    out of routing: the kubelet seeing readiness fall, the pod watch of a router (or the Service's
    endpoints) applying it, then the quiet period with no new request: detection +
    ROUTER_WATCH_SECONDS + quiet. Routers subscribed to the supervisor's state stream acknowledge much
    sooner, and the drain moves on as soon as they all have and the engine is quiet."""
    return detection_s + ROUTER_WATCH_SECONDS + quiet_s


def drain_seconds(propagation_s: float, in_flight_s: float, shutdown_s: float) -> float:
    """The whole drain `corral supervise prestop` waits for: leave routing (propagation), let in-flight
    requests finish (the longest stream under policy wait, 0 under abort), stop the engine (shutdown):
    their sum, since they run in that order."""
    return propagation_s + in_flight_s + shutdown_s


def prestop_timeout_seconds(drain_s: float) -> int:
    """`prestop --timeout`: ceil(drain + PRESTOP_SLACK), so the hook never gives up on a drain that
    is still within its own deadlines."""
    return math.ceil(drain_s + PRESTOP_SLACK_SECONDS)


def termination_grace_seconds(prestop_timeout_s: int) -> int:
    """terminationGracePeriodSeconds: prestop timeout + EXIT_SLACK. The kubelet counts the grace period
    from the start of the preStop hook; after the hook the container's SIGTERM must still leave the
    supervisor time to exit before SIGKILL."""
    return prestop_timeout_s + math.ceil(EXIT_SLACK_SECONDS)


@dataclass(frozen=True)
class RollingUpdate:
    spare_gpus: int
    max_surge: int
    max_unavailable: int


def rolling_update(
    replicas: int, gpus_per_engine: int, gpu_capacity: int, max_unavailable: int, max_surge_cap: int | None
) -> RollingUpdate:
    """Surge and unavailability from GPU capacity. spare = capacity − replicas × gpus_per_engine;
    maxSurge = min(spare // gpus_per_engine, replicas, cap): only engines whose GPUs are free can start
    before old ones stop (a pod that surges without GPUs sits Pending and the rollout stalls).
    With a surge the rollout loses no capacity (maxUnavailable 0); without one it can only progress by
    stopping engines first, so maxUnavailable = min(max_unavailable, replicas)."""
    spare = gpu_capacity - replicas * gpus_per_engine
    if spare < 0:
        raise ValueError(
            f"{replicas} engines need {replicas * gpus_per_engine} GPUs, capacity is {gpu_capacity}"
        )
    surge = min(spare // gpus_per_engine, replicas)
    if max_surge_cap is not None:
        surge = min(surge, max_surge_cap)
    unavailable = 0 if surge >= 1 else min(max_unavailable, replicas)
    return RollingUpdate(spare_gpus=spare, max_surge=surge, max_unavailable=unavailable)


@dataclass(frozen=True)
class Step:
    """One derived number and how it was computed, for `--explain`."""

    name: str
    value: float
    formula: str


@dataclass(frozen=True)
class Budgets:
    startup_timeout: int
    dependency_timeout: float
    startup_restarts: int
    restart_backoff: float
    startup_window: float
    startup_period: int
    startup_failure_threshold: int
    propagation_timeout: float
    quiet_period: float
    drain_timeout: float
    shutdown_timeout: float
    prestop_timeout: int
    termination_grace: int
    rollout: RollingUpdate
    pdb_max_unavailable: int
    progress_deadline: int
    router_request_timeout: float
    router_shutdown_timeout: float
    router_grace: int
    steps: tuple[Step, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def _g(value: float) -> str:
    return f"{value:.1f}" if value != int(value) else f"{int(value)}"


def derive(config: CorralDeployment) -> Budgets:
    """Apply the formulas above to one config."""
    s, d, p = config.startup, config.drain, config.probes
    steps: list[Step] = []
    read_s = transfer_seconds(config.model.weights_gib, s.read_gbps)
    steps.append(Step("weights read", read_s, f"{_g(config.model.weights_gib)} GiB ÷ {_g(s.read_gbps)} GB/s"))
    download_s = transfer_seconds(config.model.weights_gib, s.download_gbps) if s.download_gbps else 0.0
    if s.download_gbps:
        steps.append(
            Step("download", download_s, f"{_g(config.model.weights_gib)} GiB ÷ {_g(s.download_gbps)} GB/s")
        )
    attempt_s = load_attempt_seconds(
        read_s,
        s.process_start_seconds,
        s.quantization_seconds,
        s.compile_seconds,
        s.graph_capture_seconds,
        s.warmup_seconds,
        s.smoke_seconds,
    )
    steps.append(
        Step(
            "load attempt",
            attempt_s,
            f"read {_g(read_s)} + process {_g(s.process_start_seconds)} + quantization "
            f"{_g(s.quantization_seconds)} + compile {_g(s.compile_seconds)} + graphs "
            f"{_g(s.graph_capture_seconds)} + warmup {_g(s.warmup_seconds)} + smoke {_g(s.smoke_seconds)}",
        )
    )
    backoffs = backoff_schedule(s.restarts, s.restart_backoff_seconds)
    startup_timeout = startup_timeout_seconds(download_s, attempt_s, s.restarts, backoffs, s.margin)
    steps.append(
        Step(
            "--startup-timeout",
            startup_timeout,
            f"ceil({_g(s.margin)} × (download {_g(download_s)} + (1 + {s.restarts} restarts) × "
            f"{_g(attempt_s)}) + backoffs {_g(sum(backoffs))})",
        )
    )
    # the preload daemon is a dependency too: the supervisor waits for its /health under the same deadline
    waits = bool(config.dependencies.wait_for) or config.preload.enabled
    dependency_s = config.dependencies.timeout_seconds if waits else 0.0
    max_backoff = max(backoffs, default=0.0)
    window = startup_window_seconds(
        dependency_s, startup_timeout, s.restarts, max_backoff, d.engine_shutdown_seconds
    )
    steps.append(
        Step(
            "startup window",
            window,
            f"dependencies {_g(dependency_s)} + startup {startup_timeout} + engine stop "
            f"{_g(d.engine_shutdown_seconds)}"
            + (f" + restart overshoot ({_g(max_backoff)} + {_g(dependency_s)})" if s.restarts else ""),
        )
    )
    if config.supervisor.on_startup_failure == "rollback":
        # the failed start may take its whole window, then the rollback bundle's start gets its own
        window *= 2
        steps.append(
            Step("startup window, rollback", window, "2 × the window: the failed start, then the rollback's")
        )
    threshold = probe_failure_threshold(window, p.startup_period_seconds)
    steps.append(
        Step(
            "startupProbe.failureThreshold",
            threshold,
            f"ceil({_g(window)} ÷ period {p.startup_period_seconds}) + 1 → fails no sooner than "
            f"{(threshold - 1) * p.startup_period_seconds}s",
        )
    )
    detection = readiness_detection_seconds(p.readiness_period_seconds, p.readiness_failure_threshold)
    if d.propagation_seconds is None:
        propagation = propagation_timeout_seconds(detection, d.quiet_period_seconds)
        how = (
            f"readiness {p.readiness_period_seconds} × {p.readiness_failure_threshold} + router watch "
            f"{_g(ROUTER_WATCH_SECONDS)} + quiet {_g(d.quiet_period_seconds)}"
        )
    else:
        propagation, how = d.propagation_seconds, "drain.propagation_seconds"
    steps.append(Step("--propagation-timeout", propagation, how))
    in_flight = d.longest_stream_seconds if d.policy == "wait" else 0.0
    drain = drain_seconds(propagation, in_flight, d.engine_shutdown_seconds)
    steps.append(
        Step(
            "drain",
            drain,
            f"propagation {_g(propagation)} + in-flight {_g(in_flight)} (policy {d.policy}) + engine stop "
            f"{_g(d.engine_shutdown_seconds)}",
        )
    )
    prestop = prestop_timeout_seconds(drain)
    steps.append(Step("prestop --timeout", prestop, f"ceil({_g(drain)} + {_g(PRESTOP_SLACK_SECONDS)})"))
    grace = termination_grace_seconds(prestop)
    steps.append(
        Step("terminationGracePeriodSeconds", grace, f"prestop {prestop} + exit {_g(EXIT_SLACK_SECONDS)}")
    )
    rollout = rolling_update(
        config.replicas,
        config.engine.gpus,
        config.gpu.capacity,
        config.rollout.max_unavailable,
        config.rollout.max_surge,
    )
    steps.append(
        Step(
            "maxSurge",
            rollout.max_surge,
            f"min(spare {rollout.spare_gpus} GPUs // {config.engine.gpus} per engine, replicas "
            f"{config.replicas}"
            + (f", cap {config.rollout.max_surge}" if config.rollout.max_surge is not None else "")
            + ")",
        )
    )
    steps.append(
        Step(
            "maxUnavailable",
            rollout.max_unavailable,
            "0: surge room exists"
            if rollout.max_surge
            else f"no surge room: min(rollout.max_unavailable {config.rollout.max_unavailable}, replicas)",
        )
    )
    progress = math.ceil(window) + PROGRESS_SLACK_SECONDS
    steps.append(
        Step("progressDeadlineSeconds", progress, f"ceil(window {_g(window)}) + {PROGRESS_SLACK_SECONDS}")
    )
    router_grace = ROUTER_LEAVE_SECONDS + math.ceil(d.longest_stream_seconds + EXIT_SLACK_SECONDS)
    steps.append(
        Step(
            "router terminationGracePeriodSeconds",
            router_grace,
            f"leave {ROUTER_LEAVE_SECONDS} + longest stream {_g(d.longest_stream_seconds)} + exit "
            f"{_g(EXIT_SLACK_SECONDS)}",
        )
    )
    warnings: list[str] = []
    daemon_load = read_s + s.process_start_seconds + s.quantization_seconds
    if config.preload.enabled and config.dependencies.timeout_seconds < daemon_load:
        warnings.append(
            f"preload: the daemon loads from disk in about {_g(daemon_load)} s (read {_g(read_s)} + process "
            f"{_g(s.process_start_seconds)} + quantization {_g(s.quantization_seconds)}) but "
            f"dependencies.timeout_seconds is {_g(config.dependencies.timeout_seconds)}: the supervisor "
            "gives up on it first; raise dependencies.timeout_seconds"
        )
    if rollout.max_surge == 0 and rollout.max_unavailable >= config.replicas:
        warnings.append(
            f"no spare GPUs and {config.replicas} replica(s): a rollout stops every engine before the new "
            f"one is ready; raise gpu.capacity by {config.engine.gpus} for a rollout without downtime"
        )
    if config.rollout.max_unavailable >= config.replicas:
        warnings.append(
            "rollout.max_unavailable ≥ replicas: the PodDisruptionBudget lets a node drain evict every engine"
        )
    return Budgets(
        startup_timeout=startup_timeout,
        dependency_timeout=config.dependencies.timeout_seconds,
        startup_restarts=s.restarts,
        restart_backoff=s.restart_backoff_seconds,
        startup_window=window,
        startup_period=p.startup_period_seconds,
        startup_failure_threshold=threshold,
        propagation_timeout=propagation,
        quiet_period=d.quiet_period_seconds,
        drain_timeout=d.longest_stream_seconds,
        shutdown_timeout=d.engine_shutdown_seconds,
        prestop_timeout=prestop,
        termination_grace=grace,
        rollout=rollout,
        pdb_max_unavailable=config.rollout.max_unavailable,
        progress_deadline=progress,
        router_request_timeout=d.longest_stream_seconds,
        router_shutdown_timeout=d.longest_stream_seconds,
        router_grace=router_grace,
        steps=tuple(steps),
        warnings=tuple(warnings),
    )
