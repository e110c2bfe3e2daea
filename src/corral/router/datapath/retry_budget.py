"""The retry budget: retries may add at most `ratio` of the requests seen over a sliding window,
plus a small floor, so that a sick fleet is not hammered by a retry storm (Envoy's retry budget).

Counts live in one-second buckets; a request is counted when it arrives, a retry when it is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryBudgetConfig:
    ratio: float = 0.2
    min_retries: int = 3
    window_seconds: int = 10


class RetryBudget:
    def __init__(self, config: RetryBudgetConfig) -> None:
        if config.window_seconds < 1:
            raise ValueError("the retry budget window must be at least 1 s")
        self._config = config
        n = config.window_seconds
        self._requests = [0] * n
        self._retries = [0] * n
        self._stamps = [-1] * n  # which whole second each bucket holds

    def _bucket(self, now: float) -> int:
        second = math.floor(now)
        i = second % self._config.window_seconds
        if self._stamps[i] != second:
            self._stamps[i] = second
            self._requests[i] = 0
            self._retries[i] = 0
        return i

    def _totals(self, now: float) -> tuple[int, int]:
        oldest = math.floor(now) - self._config.window_seconds + 1
        requests = retries = 0
        for stamp, req, ret in zip(self._stamps, self._requests, self._retries, strict=True):
            if stamp >= oldest:
                requests += req
                retries += ret
        return requests, retries

    def record_request(self, now: float) -> None:
        self._requests[self._bucket(now)] += 1

    def allowed(self, now: float) -> int:
        """How many retries the window allows in all, spent or not."""
        requests, _ = self._totals(now)
        return self._config.min_retries + int(self._config.ratio * requests)

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is spent."""
        requests, retries = self._totals(now)
        if retries >= self._config.min_retries + int(self._config.ratio * requests):
            return False
        self._retries[self._bucket(now)] += 1
        return True
