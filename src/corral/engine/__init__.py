"""What Corral knows about vLLM, in one place: metric names, the metrics parser, the development-endpoint
client, the `/v1/models` probe, the lean page GET the router scrapes and probes engines with
(`page_get`), the evidence lines, vLLM's flag rules."""
