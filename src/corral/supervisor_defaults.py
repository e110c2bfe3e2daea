"""The supervisor's defaults that `corral k8s render` reads too, in a leaf module so that the
supervisor's CLI, its config and the renderer read one number without importing the supervisor: the
not-answering rule's `--unanswered-seconds`, and the cap on the engine restarts' backoff (which the
rendered probes' budgets must outlast)."""

from __future__ import annotations

# Five probe periods of silence: short of the 15 s bound with the readinessProbe, long enough
# that an API server loop blocked for a second or two is not withdrawn (supervisor/checks/answering.py).
DEFAULT_UNANSWERED_SECONDS = 5.0

# The longest wait between two restarts of a failed engine (`SupervisorConfig.restart_backoff_cap`).
RESTART_BACKOFF_CAP_SECONDS = 30.0
