"""The tracer provider a Corral process exports through when tracing is configured: its resource
(`service.name`, `OTEL_RESOURCE_ATTRIBUTES`), the sampler from `OTEL_TRACES_SAMPLER(_ARG)` (the SDK's
default: parent-based, always on), and a BatchSpanProcessor over `OtlpJsonExporter` with a bounded
queue: a span that finds the queue full is dropped, never waited for."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer

from corral import __version__
from corral.tracing.exporter import OtlpJsonExporter
from corral.tracing.settings import TracingSettings

log = logging.getLogger("corral.tracing")

MAX_QUEUE_SPANS = 2048  # spans waiting for export; more are dropped
MAX_BATCH_SPANS = 512
EXPORT_EVERY_MS = 1000
SHUTDOWN_FLUSH_MS = 3000  # what a stopping process gives its last spans


@dataclass(slots=True)
class Tracing:
    """A process's tracing: `tracer(scope)` for its spans, `close` when it stops (a bounded flush)."""

    provider: TracerProvider
    exporter: OtlpJsonExporter
    settings: TracingSettings

    def tracer(self, scope: str) -> Tracer:
        return self.provider.get_tracer(scope, __version__)

    def flush(self, timeout_millis: int = SHUTDOWN_FLUSH_MS) -> bool:
        return self.provider.force_flush(timeout_millis)

    def close(self) -> None:
        self.provider.force_flush(SHUTDOWN_FLUSH_MS)
        self.provider.shutdown()


def start_tracing(settings: TracingSettings) -> Tracing:
    """A provider exporting to `settings.endpoint` (not the global one: nothing else in the process
    exports through it by accident)."""
    resource = Resource.create({SERVICE_NAME: settings.service_name, "service.version": __version__})
    provider = TracerProvider(resource=resource)
    exporter = OtlpJsonExporter(settings)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=MAX_QUEUE_SPANS,
            max_export_batch_size=MAX_BATCH_SPANS,
            schedule_delay_millis=EXPORT_EVERY_MS,
            export_timeout_millis=settings.timeout_seconds * 1000,
        )
    )
    log.info("traces: exporting as OTLP/HTTP JSON to %s as %s", settings.endpoint, settings.service_name)
    return Tracing(provider, exporter, settings)
