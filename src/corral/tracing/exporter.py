"""Corral's span exporter: POSTs each batch the SDK's BatchSpanProcessor hands it to the OTLP/HTTP
receiver as JSON (`otlp_json`), within the configured timeout, from the processor's own thread (the SDK
forces one), so a slow or absent collector never holds a request. A failed export drops that batch (no
retry queue beyond the processor's bounded one) and says so in one WARNING line a minute at most, with
the endpoint and the reason: never the headers, which may carry the collector's credentials."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from corral.tracing.otlp_json import encode_spans
from corral.tracing.settings import TracingSettings

log = logging.getLogger("corral.tracing")

WARN_EVERY_SECONDS = 60.0
_ANSWER_READ_BYTES = 64 * 1024  # a receiver's answer is read (to reuse nothing) and dropped; bounded


class OtlpJsonExporter(SpanExporter):
    """Spans to `settings.endpoint` as `application/json`; SUCCESS on a 2xx, FAILURE otherwise."""

    def __init__(self, settings: TracingSettings) -> None:
        self._url = settings.endpoint
        self._timeout = settings.timeout_seconds
        self._headers = {"Content-Type": "application/json", **dict(settings.headers)}
        self._lock = threading.Lock()
        self._closed = False
        self._warned_at = -WARN_EVERY_SECONDS
        self.exported = 0  # spans a receiver accepted
        self.failed = 0  # spans dropped by a failed export

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed or not spans:
            return SpanExportResult.FAILURE if self._closed else SpanExportResult.SUCCESS
        body = encode_spans(spans)
        request = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as answer:  # http(s): settings checks
                answer.read(_ANSWER_READ_BYTES)
        except urllib.error.HTTPError as exc:
            return self._failed(len(spans), f"the receiver answered {exc.code} {exc.reason}")
        except (OSError, ValueError) as exc:  # refused, unreachable, timed out, reset
            return self._failed(len(spans), f"{type(exc).__name__}: {_reason(exc)}")
        with self._lock:
            self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def _failed(self, count: int, why: str) -> SpanExportResult:
        now = time.monotonic()
        with self._lock:
            self.failed += count
            warn = now - self._warned_at >= WARN_EVERY_SECONDS
            if warn:
                self._warned_at = now
            dropped = self.failed
        if warn:
            log.warning(
                "traces: could not export %d spans to %s (%s); dropped, %d dropped so far; requests are not "
                "affected (next warning in %.0f s at most)",
                count,
                self._url,
                why,
                dropped,
                WARN_EVERY_SECONDS,
            )
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)[:200]
    return str(exc)[:200]
