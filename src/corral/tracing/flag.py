"""`--otlp-traces-endpoint`, the one flag every traced command (`corral router`, `corral supervise`,
`corral rollout`) takes, named as vLLM names its own; and its reading into settings, a bad
configuration being a usage error that names the variable or flag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from corral.tracing.settings import TracingConfigError, TracingSettings, tracing_settings

F = TypeVar("F", bound=Callable[..., Any])


def otlp_traces_option(func: F) -> F:
    return click.option(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="Export traces as OTLP/HTTP JSON to this receiver, e.g. http://127.0.0.1:4318 (a URL with no "
        "path gets /v1/traces). Else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT; "
        "neither: no traces. OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME and OTEL_TRACES_SAMPLER(_ARG) "
        "apply (docs/tracing.md).",
    )(func)


def settings_from_flag(endpoint: str | None, service: str) -> TracingSettings | None:
    """The settings for a command's process, or None (tracing off); a click usage error when they
    cannot be used."""
    try:
        return tracing_settings(endpoint, service)
    except TracingConfigError as exc:
        raise click.UsageError(str(exc)) from None
