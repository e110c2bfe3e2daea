"""The per-endpoint traffic series of the router's `/metrics` (each endpoint's `EndpointTraffic`, what
`/v1/fleet` sends as `traffic`), written as Prometheus text here rather than through prometheus_client.

At a thousand endpoints they are some 20 000 samples, and prometheus_client's writer validates and
escapes every label of every sample: measured, it made a scrape about 20 times as long as the rest of
the page together, all of it blocking the router's event loop. Here each endpoint's label is escaped
once and each line is one f-string, in the same text format (0.0.4) the rest of the page is in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from corral.router.telemetry.metrics import TTFT_BUCKETS

if TYPE_CHECKING:  # membership keeps the recorder on each endpoint: no run-time import back
    from corral.router.membership.endpoint import Endpoint

REQUESTS = "corral_router_endpoint_requests_total"
TTFT = "corral_router_endpoint_ttft_seconds"
WARMUP = "corral_router_endpoint_warmup_ttft_seconds"

_HEAD_REQUESTS = (
    f"# HELP {REQUESTS} Attempts each endpoint ended, by outcome: error when the serving side failed it "
    "(5xx, a connection failure after it was picked, retried elsewhere or not, a stream cut or ended by the "
    "engine's error or abort event), ok otherwise (a client's 4xx included).\n"
    f"# TYPE {REQUESTS} counter\n"
)
_HEAD_TTFT = (
    f"# HELP {TTFT} Each endpoint's time to first token, from when it was picked to its first "
    "token-carrying chunk (a non-stream: the whole answer), steady state: the first one since it became "
    f"routable is {WARMUP}.\n"
    f"# TYPE {TTFT} histogram\n"
)
_HEAD_WARMUP = (
    f"# HELP {WARMUP} The TTFT of each endpoint's first request since it last became routable (first "
    "READY, a wake, back from an ejection, its group whole again); absent before that request.\n"
    f"# TYPE {WARMUP} gauge\n"
)
_LE = (*(f'le="{bound}"' for bound in TTFT_BUCKETS), 'le="+Inf"')
_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


def endpoint_series(endpoints: Iterable[Endpoint]) -> bytes:
    """The three families for `endpoints`: requests by outcome, the steady TTFT histogram folded into
    the router's coarse `TTFT_BUCKETS` (exact: each is one of `LATENCY_BOUNDS`), the warmup gauge."""
    requests, ttft, warmup = [_HEAD_REQUESTS], [_HEAD_TTFT], [_HEAD_WARMUP]
    for endpoint in endpoints:
        label = 'endpoint="' + endpoint.url.translate(_ESCAPES) + '"'
        traffic = endpoint.traffic
        requests.append(f'{REQUESTS}{{{label},outcome="ok"}} {traffic.requests - traffic.errors}\n')
        requests.append(f'{REQUESTS}{{{label},outcome="error"}} {traffic.errors}\n')
        histogram = traffic.ttft
        for le, (_, running) in zip(_LE, histogram.folded(TTFT_BUCKETS), strict=True):
            ttft.append(f"{TTFT}_bucket{{{label},{le}}} {running:.0f}\n")
        ttft.append(f"{TTFT}_count{{{label}}} {histogram.count}\n")
        ttft.append(f"{TTFT}_sum{{{label}}} {histogram.total!r}\n")
        if traffic.warmup_ttft_s is not None:
            warmup.append(f"{WARMUP}{{{label}}} {traffic.warmup_ttft_s!r}\n")
    return "".join((*requests, *ttft, *warmup)).encode()
