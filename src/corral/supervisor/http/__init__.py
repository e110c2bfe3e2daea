"""The supervisor's HTTP surfaces: probes and management API, its guard, the admission gate, metrics."""
