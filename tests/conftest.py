"""Shared pytest set-up: the tests package is importable as `tests.support`; every Hypothesis test runs
without a per-example deadline (a loaded CI machine makes any wall-clock deadline a coin flip, and speed
claims live in benchmarks/, not in tests)."""

import os

from hypothesis import settings

# Routers started by tests run as one process (`corral router --workers` defaults to the CPU count);
# the tests about workers pass --workers themselves.
os.environ.setdefault("CORRAL_ROUTER_WORKERS", "1")

settings.register_profile("corral", deadline=None)
settings.load_profile("corral")
