"""Where traces go: the standard OTEL_* variables and --otlp-traces-endpoint, and the refusals (a
protocol other than http/json, credentials in a URL, malformed or oversized headers or timeout), each
naming what to set and never a header's value."""

from __future__ import annotations

import pytest

from corral.tracing.settings import (
    MAX_HEADERS,
    MAX_HEADERS_CHARS,
    TracingConfigError,
    TracingSettings,
    parse_headers,
    tracing_settings,
)


def test_off_unless_an_endpoint_is_configured() -> None:
    assert tracing_settings(None, "corral-router", {}) is None
    assert (
        tracing_settings(
            None, "x", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
        )
        is None
    )
    assert (
        tracing_settings(
            None, "x", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}
        )
        is None
    )


@pytest.mark.parametrize(
    ("flag", "env", "url"),
    [
        ("http://c:4318", {}, "http://c:4318/v1/traces"),  # the flag: a bare URL gets the path
        ("http://c:4318/custom", {}, "http://c:4318/custom"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/otlp"}, "https://c/otlp"),  # as it is
        (
            "http://flag:1",
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:2/v1/traces"},
            "http://flag:1/v1/traces",
        ),
    ],
)
def test_the_endpoint_by_the_otlp_rules(flag: str | None, env: dict[str, str], url: str) -> None:
    settings = tracing_settings(flag, "corral-router", env)
    assert settings is not None and settings.endpoint == url


def test_service_name_timeout_and_headers() -> None:
    settings = tracing_settings(
        "http://c:4318",
        "corral-router",
        {
            "OTEL_SERVICE_NAME": "edge-router",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20s3cr3t, x-tenant = blue",
        },
    )
    assert settings == TracingSettings(
        "http://c:4318/v1/traces",
        "edge-router",
        (("Authorization", "Bearer s3cr3t"), ("x-tenant", "blue")),
        2.5,
    )
    assert "s3cr3t" not in repr(settings)
    assert tracing_settings("http://c", "corral-router", {}).service_name == "corral-router"  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_protocol_other_than_http_json_is_refused_saying_what_to_set(name: str, protocol: str) -> None:
    with pytest.raises(TracingConfigError) as caught:
        tracing_settings("http://c:4318", "x", {name: protocol})
    message = str(caught.value)
    assert name in message and protocol in message and "http/json" in message
    assert tracing_settings("http://c:4318", "x", {name: "http/json"}) is not None


@pytest.mark.parametrize(
    ("env", "flag", "says"),
    [
        ({}, "grpc://c:4317", "http(s) URL"),
        ({}, "http://user:pw@c:4318", "OTEL_EXPORTER_OTLP_HEADERS"),
        ({}, "http://c/" + "p" * 3000, "at most 2048"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "http://c", "OTLP"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "9" * 5000}, "http://c", "milliseconds"),  # never int() of the run
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, "http://c", "milliseconds"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, "http://c", "milliseconds"),
        ({"OTEL_SERVICE_NAME": "s" * 300}, "http://c", "at most 256"),
    ],
)
def test_a_bad_configuration_is_refused_with_what_to_do(env: dict[str, str], flag: str, says: str) -> None:
    with pytest.raises(TracingConfigError) as caught:
        tracing_settings(flag, "x", env)
    assert says in str(caught.value)
    assert "user:pw" not in str(caught.value)  # a URL's credentials are not echoed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("Authorization", "entry 1 is not `name=value`"),
        ("ok=1,bad name=top-secret-value", "entry 2"),
        ("a=1,b=%0Atop-secret-value", "control or non-ASCII"),
        ("a=" + "x" * MAX_HEADERS_CHARS, f"at most {MAX_HEADERS_CHARS}"),
        (",".join(f"h{i}=v" for i in range(MAX_HEADERS + 1)), f"at most {MAX_HEADERS}"),
    ],
)
def test_malformed_or_oversized_headers_are_refused_never_echoing_a_value(text: str, says: str) -> None:
    with pytest.raises(TracingConfigError) as caught:
        parse_headers(text, "OTEL_EXPORTER_OTLP_HEADERS")
    message = str(caught.value)
    assert says in message and "OTEL_EXPORTER_OTLP_HEADERS" in message
    assert "top-secret-value" not in message


def test_the_exporters_headers_are_secrets_wherever_an_environment_is_shown() -> None:
    from corral.redaction import MASK, redact_env

    shown = redact_env({"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x", "OTEL_SERVICE_NAME": "r"})
    assert shown == {"OTEL_EXPORTER_OTLP_HEADERS": MASK, "OTEL_SERVICE_NAME": "r"}
