"""The admission gate's counts on the supervisor's `/metrics`, read from the gate at scrape time:
requests in flight and admitted per model or adapter, refusals per model and reason, and forced exits
by whether tokens had been sent."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from corral.metric_families import labelled_counter, labelled_gauge
from corral.supervisor.http.admission import AdmissionGate


class AdmissionCollector:
    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[Metric]:
        gate = self._gate
        # every model ever admitted keeps its series (at 0 when idle) instead of vanishing
        models = set(gate.admitted) | set(gate.in_flight)
        yield labelled_gauge(
            "corral_supervisor_admission_in_flight",
            "Requests the admission gate has forwarded to the engine and not yet finished, by model or "
            "adapter.",
            ["model"],
            {(model,): gate.in_flight.get(model, 0) for model in models},
        )
        yield labelled_counter(
            "corral_supervisor_admission_admitted",
            "Inference requests the admission gate forwarded to the engine, by model or adapter.",
            ["model"],
            {(model,): n for model, n in gate.admitted.items()},
        )
        yield labelled_counter(
            "corral_supervisor_admission_rejected",
            "Requests the admission gate refused, by model (empty when not read) and reason (not_ready: "
            "503 while the engine is not READY; path_not_served: 404 for a path not on the data port).",
            ["model", "reason"],
            {(model, reason): n for (model, reason), n in gate.refused.items()},
        )
        yield labelled_counter(
            "corral_supervisor_forced_exit_requests",
            "Requests through the admission gate that the engine's side ended before their answer was "
            "complete (cut by its stop or a failed connection, or aborted), by whether generated tokens "
            "had reached the client (the request ids: the oplog's forced_exit records).",
            ["tokens_emitted"],
            {("true",): gate.requests.forced[True], ("false",): gate.requests.forced[False]},
        )
