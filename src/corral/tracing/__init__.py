"""OpenTelemetry traces of what Corral does: a span per routed request (the router), a trace per runbook
operation (the supervisor) and per rollout, exported as OTLP/HTTP with the JSON encoding by Corral's own
exporter (`otlp_json`, `exporter`), off unless configured (`settings`)."""
