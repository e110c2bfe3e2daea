"""The Mooncake FAST'25 trace as a `bench_prefix.py` workload (`--workload mooncake`), and its cost-model
reference router.

Each trace line is one request: `timestamp` (ms), `input_length`, `output_length` (tokens) and `hash_ids`,
one per 512-token block of the prompt, where equal ids mean equal prefixes. Replayed here, each block id
becomes `block_words` words of text drawn from a seed of (the target's salt, the id), so equal ids give
equal prompt text and each target meets fresh text; the last, partial block is cut to its share of
`block_words`; outputs are `output_length / output_divisor` tokens; arrivals are `timestamp / speedup`.

The reference (`CostModelReference`) sends each request to the engine where its prefill would finish
first, knowing what no router is told: each engine's cached blocks as an LRU of the trace's block ids
with the engines' capacity, the prefill still outstanding on each engine (requests sent there that have
not yet had a first token), and the prefill cost per uncached token.

    .venv/bin/python benchmarks/mooncake_trace.py cut SRC DST --every 5   # how the subset was made
"""

from __future__ import annotations

import argparse
import math
import random
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import orjson

TRACE_BLOCK_TOKENS = 512
SUBSET = Path(__file__).resolve().parent / "data" / "mooncake_synthetic_subset.jsonl"


@dataclass(frozen=True)
class TraceRequest:
    at_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(path: Path, limit: int | None = None) -> list[TraceRequest]:
    requests = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        row = orjson.loads(line)
        requests.append(
            TraceRequest(row["timestamp"], row["input_length"], row["output_length"], tuple(row["hash_ids"]))
        )
        if limit is not None and len(requests) >= limit:
            break
    return requests


@dataclass(frozen=True)
class TraceScale:
    """How the trace is shrunk so that this machine keeps up."""

    block_words: int = 32  # words (about tokens) per 512-token block: prompts 16x shorter
    speedup: float = 20.0  # arrivals this many times faster
    output_divisor: int = 8  # outputs this many times shorter

    def words(self, request: TraceRequest, k: int) -> int:
        """Words of the request's block `k` (the last is partial)."""
        if k < len(request.hash_ids) - 1:
            return self.block_words
        rest = request.input_length - TRACE_BLOCK_TOKENS * (len(request.hash_ids) - 1)
        return max(1, min(self.block_words, round(rest * self.block_words / TRACE_BLOCK_TOKENS)))

    def max_tokens(self, request: TraceRequest) -> int:
        return max(1, math.ceil(request.output_length / self.output_divisor))

    def working_set_words(self, requests: list[TraceRequest]) -> int:
        return self.block_words * len({h for r in requests for h in r.hash_ids})


def prefix_trees(requests: list[TraceRequest]) -> list[int]:
    """Each request's prefix tree (its first block id, numbered in order of first use): a request shares
    blocks only with requests of its own tree, since a shared block implies a shared first block."""
    roots: dict[int, int] = {}
    return [roots.setdefault(r.hash_ids[0], len(roots)) for r in requests]


class BlockText:
    """Deterministic text of each block id under one salt."""

    def __init__(self, salt: int, words: tuple[str, ...], block_words: int) -> None:
        self.salt = salt
        self.vocabulary = words
        self.block_words = block_words
        self.cache: dict[int, list[str]] = {}

    def block(self, hash_id: int) -> list[str]:
        text = self.cache.get(hash_id)
        if text is None:
            rng = random.Random(f"{self.salt}/{hash_id}")
            text = [rng.choice(self.vocabulary) for _ in range(self.block_words)]
            self.cache[hash_id] = text
        return text

    def prompt(self, request: TraceRequest, scale: TraceScale) -> str:
        parts: list[str] = []
        for k, h in enumerate(request.hash_ids):
            parts += self.block(h)[: scale.words(request, k)]
        return " ".join(parts)


class TraceWorkload:
    """The trace as `bench_prefix.py` replays it: the arrival schedule (group = the request's prefix tree,
    for the oracle's pins), each request's body under this target's salt, no warm-up."""

    def __init__(
        self,
        requests: list[TraceRequest],
        scale: TraceScale,
        model: str,
        salt: int,
        vocabulary: tuple[str, ...],
    ) -> None:
        self.requests = requests
        self.scale = scale
        self.model = model
        self.text = BlockText(salt, vocabulary, scale.block_words)
        trees = prefix_trees(requests)
        self.schedule = [
            ((r.at_ms - requests[0].at_ms) / 1000 / scale.speedup, tree, 0)
            for r, tree in zip(requests, trees, strict=True)
        ]
        self.weights = [0.0] * (max(trees) + 1 if trees else 0)
        for r, tree in zip(requests, trees, strict=True):
            self.weights[tree] += len(r.hash_ids)
        self.pin: list[int] = []  # each tree's engine for the oracle, set by its caller

    def warmup(self) -> list[tuple[int, int, int]]:
        return []

    def body(self, group: int, user: int, i: int) -> bytes:
        request = self.requests[i]
        return orjson.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": self.text.prompt(request, self.scale)}],
                "max_tokens": self.scale.max_tokens(request),
                "temperature": 0,
                "stream": True,
            }
        )


class CostModelReference:
    """Routes each request to the engine where its prefill would finish first (the module's docstring).
    An engine's outstanding prefill is shared by its `slots` sequence slots (a fluid approximation)."""

    def __init__(
        self,
        requests: list[TraceRequest],
        scale: TraceScale,
        engines: int,
        capacity_blocks: int,
        ms_per_token: float,
        slots: int,
    ) -> None:
        self.requests = requests
        self.scale = scale
        self.caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
        self.capacity = capacity_blocks
        self.ms_per_token = ms_per_token
        self.slots = slots
        self.outstanding: list[dict[int, float]] = [{} for _ in range(engines)]

    def cached_blocks(self, engine: int, request: TraceRequest) -> int:
        cache = self.caches[engine]
        n = 0
        for h in request.hash_ids:
            if h not in cache:
                break
            n += 1
        return n

    def prefill_ms(self, engine: int, request: TraceRequest) -> float:
        cached = self.cached_blocks(engine, request)
        uncached = sum(self.scale.words(request, k) for k in range(cached, len(request.hash_ids)))
        return uncached * self.ms_per_token

    def choose(self, i: int, group: int) -> int:
        if i < 0:  # no warm-up in a trace
            return 0
        request = self.requests[i]

        def finish(e: int) -> float:
            return sum(self.outstanding[e].values()) / self.slots + self.prefill_ms(e, request)

        engine = min(range(len(self.caches)), key=finish)
        self.outstanding[engine][i] = self.prefill_ms(engine, request)
        cache = self.caches[engine]
        for h in request.hash_ids:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.capacity:
            cache.popitem(last=False)
        return engine

    def first_token(self, i: int) -> None:
        for queue in self.outstanding:
            queue.pop(i, None)


def cut(src: Path, dst: Path, every: int) -> None:
    """Keep the requests of every `every`-th prefix tree (first block id divisible by `every`), in order,
    with their original lines: whole trees, so every shared prefix of the kept requests is kept."""
    kept = [line for line in src.read_bytes().splitlines() if orjson.loads(line)["hash_ids"][0] % every == 0]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(b"\n".join(kept) + b"\n")
    print(f"kept {len(kept)} requests of {src}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cut", help="keep every N-th prefix tree of a trace")
    c.add_argument("src", type=Path)
    c.add_argument("dst", type=Path)
    c.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    cut(args.src, args.dst, args.every)


if __name__ == "__main__":
    main()
