"""The randomized workload family of `bench_prefix.py --sweep N --sweep-seed S`: the workload settings of
each draw (drawn from a seed printed with it) and the summary of every target's ratios to the oracle.

A draw picks the prefix groups per engine, the system prompts' sizes, the groups' popularity skew (Zipf s),
single- or multi-turn users, each engine's cache against the groups' working set, and the arrival rate.
The rate is set from the fleet, not drawn: a fraction of what the engines could admit if every request
missed the cache (their KV blocks and sequence slots against a miss's prefill), so a router that loses
the hits queues while the oracle, which hits, stays near its unloaded TTFT. It is capped by what this
machine's load generator, routers and simulators keep up with (`RATE_CAP`).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

# Requests/s this 2-core machine carries through a router to 4 sims with prompts of up to ~2,000 tokens
# without the load generator falling behind its schedule (issue 17's presets run 3-16 req/s).
RATE_CAP = 14.0
RATE_FLOOR = 3.0
BLOCK = 16  # the sims' block size, tokens
QUESTION_TOKENS = 20  # a user's question after the system prompt, about


@dataclass(frozen=True)
class SweepDraw:
    """One draw's workload: the `bench_prefix.py` settings it overrides, and the figures they came from."""

    index: int
    seed: int
    groups: int
    system_words: tuple[int, int]
    zipf: float
    multi_turn: bool
    cache_fraction: float  # each engine's KV blocks / the groups' system prompts' blocks, as drawn
    kv_cache_blocks: int
    load: float  # the rate / what the fleet admits when every request misses
    rate: float

    def settings(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "users": 4,
            "system_words": self.system_words,
            "zipf": self.zipf,
            "multi_turn": self.multi_turn,
            "kv_cache_blocks": self.kv_cache_blocks,
            "rate": self.rate,
            "seed": self.seed,
        }

    def describe(self) -> str:
        d = asdict(self)
        return " ".join(f"{k}={v}" for k, v in d.items())


def draw_seed(sweep_seed: int, index: int) -> int:
    """Draw `index`'s seed, printed with it (`--sweep-seed S --sweep-draws I,J` reruns draws I and J)."""
    return random.Random(f"bench_prefix sweep {sweep_seed}/{index}").randrange(2**31)


def draw(
    sweep_seed: int, index: int, engines: int, max_num_seqs: int, max_tokens: int, prefill_ms: float
) -> SweepDraw:
    seed = draw_seed(sweep_seed, index)
    rng = random.Random(seed)
    groups = engines * rng.randint(1, 5)
    low = rng.randrange(150, 1000, 10)
    high = int(low * rng.uniform(1.0, 2.0))
    zipf = rng.choice((0.0, 0.0, round(rng.uniform(0.5, 1.3), 2)))
    multi_turn = rng.random() < 0.5
    cache_fraction = round(rng.uniform(0.2, 0.7), 2)
    mean_prompt = (low + high) / 2 + QUESTION_TOKENS + (60 if multi_turn else 0)
    working_set = groups * math.ceil(mean_prompt / BLOCK)
    request_blocks = math.ceil((high + QUESTION_TOKENS + 120 + max_tokens) / BLOCK)
    # an engine must admit a few of the largest requests at once, or the oracle queues too
    kv_cache_blocks = max(int(cache_fraction * working_set), 4 * request_blocks)
    # what the fleet admits per second when every request misses: each holds its blocks and a slot for
    # its prefill and its decode
    miss_s = (2 + mean_prompt * prefill_ms) / 1000 + max_tokens * 0.002 * 1.25
    per_engine = min(max_num_seqs, kv_cache_blocks / math.ceil((mean_prompt + max_tokens) / BLOCK)) / miss_s
    load = round(rng.uniform(0.5, 1.0), 2)
    rate = round(min(RATE_CAP, max(RATE_FLOOR, load * engines * per_engine)), 1)
    return SweepDraw(
        index, seed, groups, (low, high), zipf, multi_turn, cache_fraction, kv_cache_blocks, load, rate
    )


@dataclass(frozen=True)
class DrawRatios:
    """A target's figures in one draw against the oracle's in the same draw."""

    p90_ratio: float | None  # TTFT p90 / the oracle's
    hit_delta: float | None  # hit rate - the oracle's


def ratios(rows: list[dict[str, Any]], reference: str = "oracle") -> dict[str, DrawRatios]:
    by = {r["target"]: r for r in rows}
    ref = by.get(reference)
    out: dict[str, DrawRatios] = {}
    if ref is None:
        return out
    for name, r in by.items():
        if name == reference:
            continue
        p90 = r["ttft_p90_ms"] / ref["ttft_p90_ms"] if ref["ttft_p90_ms"] and r["ttft_p90_ms"] else None
        hit = r["hit_rate"] - ref["hit_rate"] if None not in (r["hit_rate"], ref["hit_rate"]) else None
        out[name] = DrawRatios(None if p90 is None else round(p90, 2), None if hit is None else round(hit, 3))
    return out


def summary(draws: list[dict[str, DrawRatios]]) -> list[dict[str, Any]]:
    """Per target: the median and the worst (highest p90 ratio, lowest hit delta) over the draws."""
    names: list[str] = []
    for d in draws:
        names += [n for n in d if n not in names]
    rows = []
    for name in names:
        p90 = [x for d in draws if name in d and (x := d[name].p90_ratio) is not None]
        hit = [x for d in draws if name in d and (x := d[name].hit_delta) is not None]
        rows.append(
            {
                "target": name,
                "draws": len(p90),
                "p90_ratio_median": round(statistics.median(p90), 2) if p90 else None,
                "p90_ratio_worst": max(p90) if p90 else None,
                "hit_delta_median": round(statistics.median(hit), 3) if hit else None,
                "hit_delta_worst": min(hit) if hit else None,
            }
        )
    return rows
