"""The labels and annotations on Corral's pods: what `corral k8s render` writes and the router's
Kubernetes pod source (`corral.router.discovery.k8s_pods`) reads, named once for both."""

from __future__ import annotations

DEPLOYMENT_LABEL = "corral.dev/deployment"  # the deployment a pod belongs to (the router's --selector)
ROLE_LABEL = "corral.dev/role"  # engine | router, or a P/D engine's prefill | decode | both
SUPERVISOR_PORT_ANNOTATION = "corral.dev/supervisor-port"  # where the supervisor's state stream answers
KV_EVENTS_ANNOTATION = "corral.dev/kv-events"  # PUB[,REPLAY]: where the engine publishes KV events
SERVING_GROUP_LABEL = "corral.dev/serving-group"
SERVING_GROUP_SIZE_ANNOTATION = "corral.dev/serving-group-size"
