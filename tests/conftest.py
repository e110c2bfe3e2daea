"""Shared pytest set-up: the tests package is importable as `tests.support`."""
