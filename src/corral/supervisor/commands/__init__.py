"""Command lines that call a running supervisor: runbook operations and the Kubernetes preStop hook."""
