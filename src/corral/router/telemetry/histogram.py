"""A plain histogram the data path bumps (a bisect and two adds per sample), read as Prometheus
buckets only when scraped."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


class Histogram:
    __slots__ = ("bounds", "buckets", "count", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)  # last one is +Inf; not cumulative
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.buckets, strict=True):
            running += n
            out.append((bound, float(running)))
        return out

    def folded(self, bounds: Sequence[float]) -> list[tuple[str, float]]:
        """`cumulative()` on coarser `bounds`, each one of this histogram's own (so folding is exact:
        every fine bucket lies inside one coarse bucket); ValueError for a bound it does not have."""
        out: list[tuple[str, float]] = []
        running, done = 0, 0
        for bound in bounds:
            at = bisect.bisect_left(self.bounds, bound)
            if at == len(self.bounds) or self.bounds[at] != bound:
                raise ValueError(f"bound {bound!r} is not one of the histogram's; it cannot be folded")
            running += sum(self.buckets[done : at + 1])
            done = at + 1
            out.append((str(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out
