"""The router's metrics: plain counters bumped on the data path, rendered in the Prometheus text
format only when scraped (a custom collector reads them; nothing Prometheus-side runs per request)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from corral.contracts.traffic import RequestCounts
from corral.metric_families import labelled_counter
from corral.router.telemetry.engine_input import EngineInputRefusals
from corral.router.telemetry.histogram import Histogram
from corral.router.telemetry.pd_metrics import PdMetrics

if TYPE_CHECKING:  # membership keeps a telemetry recorder on each endpoint: no run-time import back
    from corral.router.membership.endpoint import Endpoint

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REMOVAL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RouterMetrics:
    """Counters the proxy bumps directly."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.errors = 0
        self.retries = 0
        self.ejections = 0
        self.retry_budget_exhausted = 0
        # Requests out to an engine the router came to judge failed, by outcome: retried (no byte had
        # reached the client: sent to another engine), not_retried (the retry rule or budget said no:
        # answered 503), ended (bytes had reached the client: the stream ended with an error event).
        self.abandoned: dict[str, int] = {}
        self.duration = Histogram(DURATION_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        # Membership: events by source and type, removals by cause, relists by why.
        self.membership_events: dict[tuple[str, str], int] = {}
        self.removals: dict[str, int] = {}
        self.relists: dict[str, int] = {}
        # From a removal event's arrival at the router to the endpoint leaving the routing table.
        self.removal_latency = Histogram(REMOVAL_BUCKETS)
        # The same, for a supervisor state line; and the acknowledgements sent back, by result.
        self.supervisor_removal_latency = Histogram(REMOVAL_BUCKETS)
        self.supervisor_acks: dict[str, int] = {}
        # Wake on demand: wakes asked of a supervisor and requests held, by model; holds ended, by
        # model and outcome (served, timed_out).
        self.wakes: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.hold_outcomes: dict[tuple[str, str], int] = {}
        # Scale from zero: scale-up signals raised (no engine, none asleep, none on its way) and
        # requests answered 503 at once (why: mode_reject, hold_full), by model.
        self.scale_up_signals: dict[str, int] = {}
        self.no_engine_answers: dict[tuple[str, str], int] = {}
        # Streams that did not end normally, by model and how (corral.engine.stream_ending).
        self.stream_failures: dict[tuple[str, str], int] = {}
        # The same, split by whether generated tokens had reached the client (a sibling series, so
        # the one above stays as dashboards know it).
        self.stream_failures_by_tokens: dict[tuple[str, str, str], int] = {}
        # Prefill/decode disaggregation: per-leg latency, transfer time, pairs, failures by leg.
        self.pd = PdMetrics()
        # What engines and supervisors sent that the router refused (issue 27).
        self.engine_input = EngineInputRefusals()
        # With --workers N: how many new placements this worker made without the host's placement lock
        # (routing.placement_lock; read at scrape time).
        self.placement_waited_out: Callable[[], int] | None = None

    def count_request(self, model: str, code: int) -> None:
        key = (model, code)
        self.requests[key] = self.requests.get(key, 0) + 1

    def count_event(self, source: str, kind: str) -> None:
        key = (source, kind)
        self.membership_events[key] = self.membership_events.get(key, 0) + 1

    def count_removal(self, cause: str) -> None:
        self.removals[cause] = self.removals.get(cause, 0) + 1

    def count_abandoned(self, outcome: str) -> None:
        self.abandoned[outcome] = self.abandoned.get(outcome, 0) + 1

    def count_ack(self, result: str) -> None:
        self.supervisor_acks[result] = self.supervisor_acks.get(result, 0) + 1

    def count_relist(self, why: str) -> None:
        self.relists[why] = self.relists.get(why, 0) + 1

    def count_wake(self, model: str) -> None:
        self.wakes[model] = self.wakes.get(model, 0) + 1

    def count_held(self, model: str) -> None:
        self.held[model] = self.held.get(model, 0) + 1

    def count_scale_up(self, model: str) -> None:
        self.scale_up_signals[model] = self.scale_up_signals.get(model, 0) + 1

    def count_no_engine_answer(self, model: str, why: str) -> None:
        key = (model, why)
        self.no_engine_answers[key] = self.no_engine_answers.get(key, 0) + 1

    def count_stream_failure(self, model: str, how: str, tokens_emitted: bool) -> None:
        key = (model, how)
        self.stream_failures[key] = self.stream_failures.get(key, 0) + 1
        split = (model, how, "true" if tokens_emitted else "false")
        self.stream_failures_by_tokens[split] = self.stream_failures_by_tokens.get(split, 0) + 1

    def count_hold_outcome(self, model: str, outcome: str) -> None:
        key = (model, outcome)
        self.hold_outcomes[key] = self.hold_outcomes.get(key, 0) + 1

    def model_counts(self) -> dict[str, dict[str, int]]:
        """`/v1/fleet`'s `model_requests`: per model name, the requests the router answered and those
        it answered with a 5xx, since it started (whichever engine served them, so they outlive any)."""
        counts: dict[str, dict[str, int]] = {}
        for (model, code), n in self.requests.items():
            if not model:  # a model no engine serves: refused before any engine was asked
                continue
            each = counts.setdefault(model, {"requests": 0, "errors": 0})
            each["requests"] += n
            if code >= 500:
                each["errors"] += n
        return counts

    def totals(self) -> RequestCounts:
        """`/v1/fleet`'s `totals`: every request answered (any code, as `corral_router_requests_total`
        counts them), `errors`, every stream that did not end normally, and every request abandoned on
        an engine judged failed."""
        return RequestCounts(
            requests=sum(self.requests.values()),
            errors=self.errors,
            stream_failures=sum(self.stream_failures.values()),
            abandoned=sum(self.abandoned.values()),
        )


class RouterCollector:
    """Turns RouterMetrics and the endpoints' in-flight counts into metric families at scrape time."""

    def __init__(
        self,
        metrics: RouterMetrics,
        endpoints: Callable[[], Iterable[Endpoint]],
        warmup: Callable[[Iterable[Endpoint]], Iterable[tuple[Endpoint, float]]] | None = None,
    ) -> None:
        self._metrics = metrics
        self._endpoints = endpoints
        self._warmup = warmup  # each endpoint's slow-start weight; None while slow start is off

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        requests = CounterMetricFamily(
            "corral_router_requests",
            "Requests answered by the router, by model and status code.",
            labels=["model", "code"],
        )
        for (model, code), n in sorted(m.requests.items()):
            requests.add_metric([model, str(code)], n)
        yield requests
        yield CounterMetricFamily(
            "corral_router_errors",
            "Requests that failed in the router or upstream (no endpoint, connection failure, stream cut).",
            value=m.errors,
        )
        yield CounterMetricFamily(
            "corral_router_retries",
            "Attempts re-sent to another endpoint before any byte.",
            value=m.retries,
        )
        yield CounterMetricFamily(
            "corral_router_ejections",
            "Endpoints ejected after a connection failure or timeout.",
            value=m.ejections,
        )
        yield CounterMetricFamily(
            "corral_router_retry_budget_exhausted",
            "Retries not made because the retry budget was spent (the request got an error instead).",
            value=m.retry_budget_exhausted,
        )
        yield labelled_counter(
            "corral_router_abandoned_requests",
            "Requests out to an engine when the router judged it failed (its probe failed, or its "
            "supervisor said FAILED or DRAINING/not_answering), by outcome: retried (no byte had reached "
            "the client; sent to another engine), not_retried (retry rule or budget said no; 503), ended "
            "(bytes had reached the client; the stream ended with an error event).",
            ["outcome"],
            {(outcome,): n for outcome, n in m.abandoned.items()},
        )
        yield labelled_counter(
            "corral_router_membership_events",
            "Membership events received, by source and type (ADDED, MODIFIED, DELETED, BOOKMARK, LISTED).",
            ["source", "type"],
            {(source, kind): n for (source, kind), n in m.membership_events.items()},
        )
        yield labelled_counter(
            "corral_router_endpoint_removals",
            "Endpoints that left the routing table, by cause.",
            ["cause"],
            {(cause,): n for cause, n in m.removals.items()},
        )
        yield labelled_counter(
            "corral_router_k8s_relists",
            "Full lists of pods, by why (initial, expired, broken, resync).",
            ["why"],
            {(why,): n for why, n in m.relists.items()},
        )
        yield _histogram(
            "corral_router_removal_latency_seconds",
            "Time from a removal event's arrival at the router to the endpoint leaving the routing table.",
            m.removal_latency,
        )
        yield _histogram(
            "corral_router_supervisor_removal_latency_seconds",
            "Time from a supervisor state line's arrival at the router to the endpoint leaving the "
            "routing table.",
            m.supervisor_removal_latency,
        )
        yield labelled_counter(
            "corral_router_supervisor_acks",
            "Acknowledgements of removal sent to supervisors, by result (sent, failed).",
            ["result"],
            {(result,): n for result, n in m.supervisor_acks.items()},
        )
        yield labelled_counter(
            "corral_router_stream_failures",
            "Relayed streams that did not end normally, by model and how: engine_error (the engine's "
            "error event), engine_abort (a choice finished with reason abort), cut (the upstream failed).",
            ["model", "how"],
            {key: n for key, n in m.stream_failures.items()},
        )
        yield labelled_counter(
            "corral_router_stream_failures_by_tokens",
            "corral_router_stream_failures_total split by whether generated tokens had reached the client "
            "(tokens_emitted: true, false) when the stream failed.",
            ["model", "how", "tokens_emitted"],
            {key: n for key, n in m.stream_failures_by_tokens.items()},
        )
        yield labelled_counter(
            "corral_router_wakes",
            "Wakes asked of a supervisor because every engine of the model was SLEEPING, by model.",
            ["model"],
            {(model,): n for model, n in m.wakes.items()},
        )
        yield labelled_counter(
            "corral_router_wake_held_requests",
            "Requests held while their model's engine was woken (--wake-hold-seconds), by model.",
            ["model"],
            {(model,): n for model, n in m.held.items()},
        )
        yield labelled_counter(
            "corral_router_wake_hold_outcomes",
            "Held requests by how the hold ended: served (an engine became routable) or timed_out "
            "(--wake-hold-seconds passed; the request was answered 503).",
            ["model", "outcome"],
            {(model, outcome): n for (model, outcome), n in m.hold_outcomes.items()},
        )
        yield labelled_counter(
            "corral_router_scale_up_signals",
            "Scale-up signals raised: a request found no routable engine of its model, none asleep and none "
            "starting or waking (once per such episode), by model.",
            ["model"],
            {(model,): n for model, n in m.scale_up_signals.items()},
        )
        yield labelled_counter(
            "corral_router_no_engine_answers",
            "Requests for a model without a routable engine answered 503 at once, by model and why: "
            "mode_reject (--wake-mode reject) or hold_full (--wake-hold-max requests already held).",
            ["model", "why"],
            {key: n for key, n in m.no_engine_answers.items()},
        )
        streams = GaugeMetricFamily(
            "corral_router_supervisor_stream_up",
            "1 while the endpoint's supervisor state stream is connected and not stale.",
            labels=["endpoint", "supervisor"],
        )
        for endpoint in self._endpoints():
            if endpoint.supervisor is not None:
                up = 1 if endpoint.supervisor.link == "connected" else 0
                streams.add_metric([endpoint.url, endpoint.supervisor.url], up)
        yield streams
        in_flight = GaugeMetricFamily(
            "corral_router_endpoint_in_flight",
            "Requests this router has open to each endpoint.",
            labels=["endpoint"],
        )
        for endpoint in self._endpoints():
            in_flight.add_metric([endpoint.url], endpoint.in_flight)
        yield in_flight
        if self._warmup is not None:
            warmup = GaugeMetricFamily(
                "corral_router_endpoint_warmup_weight",
                "Slow start: the share of its full share each endpoint may take now, from 0.1 when it "
                "became routable to 1 after the ramp (--slow-start-seconds).",
                labels=["endpoint"],
            )
            for endpoint, weight in self._warmup(self._endpoints()):
                warmup.add_metric([endpoint.url], weight)
            yield warmup
        whole: dict[str, bool] = {}
        for endpoint in self._endpoints():
            if endpoint.group is not None:
                name = endpoint.group.name
                whole[name] = whole.get(name, True) and endpoint.group_out is None
        groups = GaugeMetricFamily(
            "corral_router_serving_group_whole",
            "1 while the serving group is routed to: every member READY on one bundle fingerprint; 0 while "
            "it is out (why: /v1/fleet `groups`; its members' exits count as cause group_out).",
            labels=["group"],
        )
        for name, is_whole in sorted(whole.items()):
            groups.add_metric([name], 1 if is_whole else 0)
        yield groups
        yield _histogram(
            "corral_router_request_duration_seconds",
            "Time from request arrival to its last byte.",
            m.duration,
        )
        yield _histogram(
            "corral_router_ttft_seconds",
            "Time from request arrival to the first byte sent to the client.",
            m.ttft,
        )
        yield from m.pd.families()
        yield from m.engine_input.families()
        if m.placement_waited_out is not None:
            yield CounterMetricFamily(
                "corral_router_placement_lock_waited_out",
                "New prefix placements this worker made without the host's placement lock, because a "
                "sibling worker held it past 5 ms (--workers N; routing.placement_lock).",
                value=m.placement_waited_out(),
            )


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=h.cumulative(), sum_value=h.total)


def render(collector: RouterCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return bytes(generate_latest(registry))
