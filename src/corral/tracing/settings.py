"""Where traces go, read from the standard OpenTelemetry environment and a command's
`--otlp-traces-endpoint` flag: the endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, used as it is, or
`OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`), the headers sent with every export
(`OTEL_EXPORTER_OTLP_HEADERS`, often a collector's credentials: never logged, never in an error), the
timeout and the service name. Tracing is off unless an endpoint is configured. Only OTLP/HTTP with the
JSON encoding (`http/json`) is spoken: a configuration asking for `grpc` or `http/protobuf` is refused
with what to set instead, never silently exported another way."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

TRACES_PATH = "/v1/traces"
PROTOCOL = "http/json"
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_HEADERS_CHARS = 8192  # OTEL_EXPORTER_OTLP_HEADERS, as a whole
MAX_HEADERS = 64
MAX_SERVICE_NAME_CHARS = 256
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_TIMEOUT_MS = re.compile(r"\d{1,9}")  # at most ~11 days; a longer digit run is refused, not int()-ed


class TracingConfigError(ValueError):
    """The tracing configuration cannot be used; the message names the variable or flag, and what to do
    (never a header's value)."""


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """An enabled exporter's settings. `headers` may hold secrets: it stays out of `repr`."""

    endpoint: str  # the full URL spans are POSTed to
    service_name: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS


def tracing_settings(
    flag_endpoint: str | None, default_service: str, environ: Mapping[str, str] | None = None
) -> TracingSettings | None:
    """The settings, or None when tracing is off (no endpoint configured, `OTEL_SDK_DISABLED=true` or
    `OTEL_TRACES_EXPORTER=none`). The flag wins over the environment. Raises `TracingConfigError`."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return None
    if exporter not in ("", "otlp"):
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={exporter[:40]!r}: Corral exports traces only as OTLP (set it to `otlp` "
            "or leave it unset; `none` turns tracing off)."
        )
    endpoint = _endpoint(flag_endpoint, env)
    if endpoint is None:
        return None
    _check_protocol(env)
    name = env.get("OTEL_SERVICE_NAME", "").strip() or default_service
    if len(name) > MAX_SERVICE_NAME_CHARS:
        raise TracingConfigError(
            f"OTEL_SERVICE_NAME is {len(name)} characters long; at most {MAX_SERVICE_NAME_CHARS}."
        )
    headers = parse_headers(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS"), "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
    if not headers:
        headers = parse_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS"), "OTEL_EXPORTER_OTLP_HEADERS")
    timeout = _timeout(env)
    return TracingSettings(endpoint, name, headers, timeout)


def _endpoint(flag: str | None, env: Mapping[str, str]) -> str | None:
    """The URL to POST to: the flag (a URL with no path gets /v1/traces, as a collector's default), the
    traces variable as it is, or the general one with /v1/traces appended (the OTLP spec's rule)."""
    if flag is not None and flag.strip():
        return _checked_url(flag.strip(), "--otlp-traces-endpoint", append_path=True)
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return _checked_url(traces, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", append_path=False)
    general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if general:
        url = _checked_url(general, "OTEL_EXPORTER_OTLP_ENDPOINT", append_path=False)
        return url.rstrip("/") + TRACES_PATH
    return None


def _checked_url(url: str, source: str, *, append_path: bool) -> str:
    if len(url) > 2048:
        raise TracingConfigError(f"{source} is {len(url)} characters long; at most 2048.")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise TracingConfigError(f"{source} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TracingConfigError(
            f"{source} must be an http(s) URL of an OTLP/HTTP receiver, e.g. http://127.0.0.1:4318"
            f"{TRACES_PATH} (got scheme {parts.scheme!r}); Corral does not speak OTLP over gRPC."
        )
    if parts.username is not None or parts.password is not None:
        raise TracingConfigError(
            f"{source} carries credentials in the URL; put them in OTEL_EXPORTER_OTLP_HEADERS instead "
            "(e.g. Authorization=Bearer%20...), which Corral never logs."
        )
    if append_path and parts.path in ("", "/"):
        return url.rstrip("/") + TRACES_PATH
    return url


def _check_protocol(env: Mapping[str, str]) -> None:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip().lower()
        if value and value != PROTOCOL:
            raise TracingConfigError(
                f"{name}={value[:40]!r}: Corral exports traces as OTLP/HTTP with the JSON encoding only "
                f"(`{PROTOCOL}`), which every OTLP/HTTP receiver (the collector's port 4318) accepts. Set "
                f"{name}={PROTOCOL} or unset it for Corral's processes (vLLM reads its own "
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: set that in the engine's environment only)."
            )
        if value:
            return  # the traces variable, when set, decides


def parse_headers(text: str | None, source: str) -> tuple[tuple[str, str], ...]:
    """`name=value,name2=value2` (values percent-decoded), as the OTLP exporter spec writes them.
    Bounded (MAX_HEADERS_CHARS, MAX_HEADERS); an error names the entry's position, never its value."""
    if text is None or not text.strip():
        return ()
    if len(text) > MAX_HEADERS_CHARS:
        raise TracingConfigError(f"{source} is {len(text)} characters long; at most {MAX_HEADERS_CHARS}.")
    entries = [entry for entry in text.split(",") if entry.strip()]
    if len(entries) > MAX_HEADERS:
        raise TracingConfigError(f"{source} names {len(entries)} headers; at most {MAX_HEADERS}.")
    headers: list[tuple[str, str]] = []
    for position, entry in enumerate(entries, 1):
        name, sep, value = entry.partition("=")
        name = unquote(name.strip())
        if not sep or not _HEADER_NAME.fullmatch(name):
            raise TracingConfigError(
                f"{source}: entry {position} is not `name=value` with a header name of letters, digits "
                "and -_.; write e.g. Authorization=Bearer%20<token>,X-Scope=team (values percent-encoded)."
            )
        decoded = unquote(value.strip())
        if any(ord(char) < 32 or ord(char) > 126 for char in decoded):
            raise TracingConfigError(
                f"{source}: the value of header {name!r} (entry {position}) has a control or non-ASCII "
                "character; percent-encode only printable ASCII."
            )
        headers.append((name, decoded))
    return tuple(headers)


def _timeout(env: Mapping[str, str]) -> float:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        value = env.get(name, "").strip()
        if not value:
            continue
        if not _TIMEOUT_MS.fullmatch(value) or int(value) == 0:
            raise TracingConfigError(
                f"{name}={value[:20]!r}: write the export timeout in milliseconds, 1 to 999999999."
            )
        return int(value) / 1000.0
    return DEFAULT_TIMEOUT_SECONDS
