"""The router's own metrics in the Prometheus text format."""
