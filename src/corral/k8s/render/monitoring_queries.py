"""The PromQL behind the Corral dashboard: (row, panel title, unit, [(expr, legend)]). Every metric name
here is one our router or supervisor registers or one vLLM exports (tests/unit cross-checks them)."""

from __future__ import annotations

Target = tuple[str, str]
PanelSpec = tuple[str, str, str, list[Target]]

_W = "[$__rate_interval]"


def _quantile(q: str, metric: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{_W})))"


PANELS: list[PanelSpec] = [
    (
        "Router",
        "Requests/s by status code",
        "reqps",
        [(f"sum by (code) (rate(corral_router_requests_total{_W}))", "{{code}}")],
    ),
    (
        "Router",
        "Router TTFT p50 / p99",
        "s",
        [
            (_quantile("0.5", "corral_router_ttft_seconds", "job"), "p50"),
            (_quantile("0.99", "corral_router_ttft_seconds", "job"), "p99"),
        ],
    ),
    (
        "Router",
        "TTFT p99 per endpoint",
        "s",
        [(_quantile("0.99", "corral_router_endpoint_ttft_seconds", "endpoint"), "{{endpoint}}")],
    ),
    (
        "Router",
        "In-flight requests per endpoint",
        "short",
        [("sum by (endpoint) (corral_router_endpoint_in_flight)", "{{endpoint}}")],
    ),
    (
        "Router",
        "Routable endpoints (supervisor streams up)",
        "short",
        [("sum(corral_router_supervisor_stream_up)", "streams up")],
    ),
    (
        "Router",
        "Stream failures/s by how",
        "reqps",
        [(f"sum by (how) (rate(corral_router_stream_failures_total{_W}))", "{{how}}")],
    ),
    ("Router", "Retries/s", "reqps", [(f"sum(rate(corral_router_retries_total{_W}))", "retries")]),
    (
        "Supervisors",
        "Lifecycle state per engine",
        "short",
        [("max by (pod, state) (corral_supervisor_state) > 0", "{{pod}} {{state}}")],
    ),
    (
        "Supervisors",
        "State transitions/s",
        "short",
        [(f"sum by (to_state) (rate(corral_supervisor_transitions_total{_W}))", "to {{to_state}}")],
    ),
    (
        "Supervisors",
        "Forced exits by tokens_emitted",
        "short",
        [
            (
                f"sum by (tokens_emitted) (increase(corral_supervisor_forced_exit_requests_total{_W}))",
                "tokens_emitted={{tokens_emitted}}",
            )
        ],
    ),
    (
        "Supervisors",
        "Engine restarts by cause",
        "short",
        [(f"sum by (cause) (increase(corral_supervisor_engine_restarts_total{_W}))", "{{cause}}")],
    ),
    (
        "Supervisors",
        "Admission gate refusals/s by reason",
        "reqps",
        [(f"sum by (reason) (rate(corral_supervisor_admission_rejected_total{_W}))", "{{reason}}")],
    ),
    (
        "Engines (vLLM)",
        "Running / waiting requests",
        "short",
        [
            ("sum by (pod) (vllm:num_requests_running)", "{{pod}} running"),
            ("sum by (pod) (vllm:num_requests_waiting)", "{{pod}} waiting"),
        ],
    ),
    (
        "Engines (vLLM)",
        "KV cache usage",
        "percentunit",
        [("max by (pod) (vllm:kv_cache_usage_perc)", "{{pod}}")],
    ),
    (
        "Engines (vLLM)",
        "Engine TTFT / ITL / e2e p99",
        "s",
        [
            (_quantile("0.99", "vllm:time_to_first_token_seconds", "job"), "TTFT p99"),
            (_quantile("0.99", "vllm:inter_token_latency_seconds", "job"), "ITL p99"),
            (_quantile("0.99", "vllm:e2e_request_latency_seconds", "job"), "e2e p99"),
        ],
    ),
    (
        "Engines (vLLM)",
        "Prefix cache hit rate",
        "percentunit",
        [
            (
                f"sum by (pod) (rate(vllm:prefix_cache_hits_total{_W})) / "
                f"sum by (pod) (rate(vllm:prefix_cache_queries_total{_W}))",
                "{{pod}}",
            )
        ],
    ),
    (
        "Engines (vLLM)",
        "Sleep state",
        "short",
        [("max by (pod, sleep_state) (vllm:engine_sleep_state)", "{{pod}} {{sleep_state}}")],
    ),
]
