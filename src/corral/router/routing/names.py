"""The names of the built-in routing policies: a leaf that imports nothing, so that a command line
offering them (`corral router --policy`, `corral up --policy`) can list them without loading routing."""

from __future__ import annotations

POLICY_NAMES = ("round_robin", "least_request", "session", "prefix", "load")
