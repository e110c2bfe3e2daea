"""The not-answering rule's default (`--unanswered-seconds`), in a module of its own so that the
supervisor's CLI, its config and `corral k8s render` read one number without importing the rule."""

from __future__ import annotations

# Five probe periods of silence: short of the 15 s bound with the readinessProbe, long enough
# that an API server loop blocked for a second or two is not withdrawn (supervisor/checks/answering.py).
DEFAULT_UNANSWERED_SECONDS = 5.0
