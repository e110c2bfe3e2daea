"""Kubernetes: watching pods (`watch/`) and rendering manifests (`render/`)."""
