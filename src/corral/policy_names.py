"""The names of the router's built-in routing policies: a leaf that imports nothing, so that a command
line offering them (`corral router --policy`, `corral up --policy`) and `corral k8s render` (which checks
a config's policy) can list them without loading routing; `corral.router.routing.selector` is the one
place a name becomes a policy."""

from __future__ import annotations

POLICY_NAMES = ("round_robin", "least_request", "session", "prefix", "load")
