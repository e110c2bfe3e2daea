"""What an autoscaler reads, per model, on the router's `/metrics`: how many engines are routable,
how loaded they are (the router's requests in flight, and the engines' own queue and KV cache
usage where the load scraper has a fresh reading), the requests held for want of an engine and the
oldest one's age, and a desired replica count by one rule (`desired_replicas`, docs/scaling.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from corral.engine_state import EngineState

if TYPE_CHECKING:
    from corral.router.membership.endpoint import Endpoint


class EngineReading(Protocol):
    """An engine's last word on its load (`routing.load_board.EngineLoad`)."""

    waiting: float
    kv_usage: float


class LoadReadings(Protocol):
    """The router's scraped engine loads (`routing.load_board.LoadBoard`): a fresh reading or None."""

    def fresh(self, url: str, now: float | None = None) -> EngineReading | None: ...


@dataclass(frozen=True)
class ScalingTargets:
    """The load one engine is meant to carry; a model above them on any signal wants more engines."""

    in_flight: float = 8.0  # the router's requests open per routable engine
    waiting: float = 2.0  # the engine's own queue (vllm:num_requests_waiting) per engine
    kv_usage: float = 0.8  # the engine's KV cache usage (0-1), mean over engines


@dataclass(frozen=True)
class ModelLoad:
    ready: int  # routable engines
    in_flight: float  # the router's requests open to them (all its --workers workers')
    waiting: float | None  # their own queues, summed (None: no fresh reading)
    kv_usage: float | None  # mean over those read (None: no fresh reading)
    held: int  # requests held for want of a routable engine
    asleep: int  # engines whose supervisor says SLEEPING


def desired_replicas(load: ModelLoad, targets: ScalingTargets) -> int:
    """The rule: with no routable engine, 1 while any request is held for one, else 0; otherwise
    ceil(ready × the highest of in_flight/ready ÷ target, waiting/ready ÷ target, kv_usage ÷ target),
    at least 1 and at most 2 × ready (a reading can at most double the fleet at once)."""
    if load.ready == 0:
        return 1 if load.held > 0 else 0
    ratios = [load.in_flight / load.ready / targets.in_flight]
    if load.waiting is not None:
        ratios.append(load.waiting / load.ready / targets.waiting)
    if load.kv_usage is not None:
        ratios.append(load.kv_usage / targets.kv_usage)
    wanted = math.ceil(round(load.ready * max(ratios), 9))
    return min(max(wanted, 1), 2 * load.ready)


def model_loads(
    endpoints: Iterable[Endpoint],
    routable: Callable[[str], int],
    board: LoadReadings,
    held: dict[str, int],
) -> dict[str, ModelLoad]:
    by_model: dict[str, list[Endpoint]] = {}
    for endpoint in endpoints:
        for model in endpoint.models:
            by_model.setdefault(model, []).append(endpoint)
    for model in held:
        by_model.setdefault(model, [])
    loads: dict[str, ModelLoad] = {}
    for model, serving in sorted(by_model.items()):
        ready = routable(model)
        readings: list[EngineReading] = [
            r for e in serving if e.in_routing and (r := board.fresh(e.url)) is not None
        ]
        loads[model] = ModelLoad(
            ready=ready,
            in_flight=float(sum(e.host_in_flight for e in serving)),  # every --workers worker's
            waiting=sum(r.waiting for r in readings) if readings else None,
            kv_usage=sum(r.kv_usage for r in readings) / len(readings) if readings else None,
            held=held.get(model, 0),
            asleep=sum(
                1 for e in serving if e.supervisor is not None and e.supervisor.state is EngineState.SLEEPING
            ),
        )
    return loads


class ScalingCollector:
    def __init__(
        self,
        endpoints: Callable[[], Iterable[Endpoint]],
        routable: Callable[[str], int],
        board: LoadReadings,
        held: Callable[[], dict[str, int]],
        oldest_held: Callable[[], dict[str, float]],
        targets: ScalingTargets,
    ) -> None:
        self._endpoints = endpoints
        self._routable = routable
        self._board = board
        self._held = held
        self._oldest_held = oldest_held
        self._targets = targets

    def collect(self) -> Iterator[Metric]:
        loads = model_loads(self._endpoints(), self._routable, self._board, self._held())
        oldest = self._oldest_held()

        def family(name: str, doc: str, values: dict[str, float]) -> GaugeMetricFamily:
            gauge = GaugeMetricFamily(name, doc, labels=["model"])
            for model, value in values.items():
                gauge.add_metric([model], value)
            return gauge

        yield family(
            "corral_router_model_ready_engines",
            "Engines of the model this router may route to now.",
            {m: load.ready for m, load in loads.items()},
        )
        yield family(
            "corral_router_model_asleep_engines",
            "Engines of the model whose supervisor says SLEEPING.",
            {m: load.asleep for m, load in loads.items()},
        )
        yield family(
            "corral_router_model_in_flight",
            "Requests this router (all its --workers workers) has open to the model's engines.",
            {m: load.in_flight for m, load in loads.items()},
        )
        yield family(
            "corral_router_model_waiting",
            "The model's routable engines' own queues (vllm:num_requests_waiting), summed; shown where "
            "the load scraper has a fresh reading.",
            {m: load.waiting for m, load in loads.items() if load.waiting is not None},
        )
        yield family(
            "corral_router_model_kv_usage",
            "The model's routable engines' KV cache usage (0-1), mean; shown where the load scraper has "
            "a fresh reading.",
            {m: load.kv_usage for m, load in loads.items() if load.kv_usage is not None},
        )
        yield family(
            "corral_router_model_held_requests",
            "Requests held now for want of a routable engine (--wake-hold-seconds).",
            {m: load.held for m, load in loads.items()},
        )
        yield family(
            "corral_router_model_oldest_held_seconds",
            "Age of the oldest request held now for want of a routable engine (0: none held).",
            {m: oldest.get(m, 0.0) for m in loads},
        )
        yield family(
            "corral_router_model_desired_replicas",
            "Engines the model wants by the rule in docs/scaling.md: ceil(ready x the highest load ratio "
            "to its target), within 1 and 2 x ready; with none ready, 1 while requests are held, else 0.",
            {m: desired_replicas(load, self._targets) for m, load in loads.items()},
        )
