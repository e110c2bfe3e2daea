"""Shared pytest set-up: the tests package is importable as `tests.support`."""

import os

# Routers started by tests run as one process (`corral router --workers` defaults to the CPU count);
# the tests about workers pass --workers themselves.
os.environ.setdefault("CORRAL_ROUTER_WORKERS", "1")
