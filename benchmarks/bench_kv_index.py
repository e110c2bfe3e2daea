"""The router's KV-event index at fleet scale: memory per block held and the time to answer a request.

    .venv/bin/python benchmarks/bench_kv_index.py [--engines 1000] [--blocks 2000] [--prompt-blocks 128]

Each engine stores `--blocks` blocks of 16 tokens as vLLM's BlockStored events would carry them (its own
block hashes, a parent, the token ids): `--shared` system prompts of 32 blocks drawn from a pool every
engine shares, the rest prompts of its own. It then prints the index's size (RSS growth and bytes per
block held), the ingestion rate, and per request: the content chain of a `--prompt-blocks` prompt, the
longest-prefix lookup over every engine, and the whole `held` answer over a pool of every endpoint.
Memory grows linearly in blocks held (bytes/block below); lookup time does not depend on the index's
size, only on the prompt's blocks and on how many engines hold its first block.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.kv_holders import KvPrefixHolders
from corral.router.routing.kv_index import DEFAULT_TOTAL_BLOCKS, KvIndex, content_chain
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest

BS = 16
PREFIX_BLOCKS = 32


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class IdTokens:
    """A tokenizer for the benchmark: the body's `prompt` is already token ids."""

    name = "ids"

    def tokens(self, payload: object) -> list[int] | None:
        return payload.get("prompt") if isinstance(payload, dict) else None


def fill(
    index: KvIndex, engines: int, blocks: int, shared: int, pool: list[list[int]], rng: random.Random
) -> int:
    stored = 0
    next_hash = 1
    for e in range(engines):
        url = f"http://10.0.{e // 250}.{e % 250}:8000"
        index.watch(url)
        have = 0
        for p in rng.sample(range(len(pool)), min(shared, len(pool))):
            tokens = pool[p]
            hashes = list(range(next_hash, next_hash + PREFIX_BLOCKS))
            next_hash += PREFIX_BLOCKS
            index.stored(url, hashes, None, tokens, BS)
            have += PREFIX_BLOCKS
        base = 10_000_000 + e * blocks * BS
        while have < blocks:
            n = min(PREFIX_BLOCKS, blocks - have)
            tokens = list(range(base + have * BS, base + (have + n) * BS))
            hashes = list(range(next_hash, next_hash + n))
            next_hash += n
            index.stored(url, hashes, None, tokens, BS)
            have += n
        stored += have
    return stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=2000, help="blocks held per engine")
    parser.add_argument("--shared", type=int, default=8, help="shared system prompts each engine holds")
    parser.add_argument("--pool", type=int, default=64, help="distinct shared system prompts")
    parser.add_argument("--prompt-blocks", type=int, default=128, help="blocks of each request's prompt")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(0)
    pool = [list(range(p * 100_000, p * 100_000 + PREFIX_BLOCKS * BS)) for p in range(args.pool)]
    index = KvIndex(blocks_per_engine=max(args.blocks, 1), total_blocks=args.engines * args.blocks + 1)
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    stored = fill(index, args.engines, args.blocks, args.shared, pool, rng)
    took = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - before
    print(f"engines {args.engines}, blocks held {index.blocks:,} ({index.distinct_blocks:,} distinct)")
    print(f"ingest: {stored / took:,.0f} blocks/s ({took:.1f} s)")
    print(
        f"memory: {grown / 2**20:,.0f} MiB RSS growth, "
        f"{grown / max(index.blocks, 1):.0f} bytes per block held"
    )
    endpoints = [
        Endpoint(f"http://10.0.{e // 250}.{e % 250}:8000", state=EngineState.READY)
        for e in range(args.engines)
    ]
    holders = KvPrefixHolders(index, IdTokens(), index.indexes, PrefixMemory())
    chain_us: list[float] = []
    lookup_us: list[float] = []
    held_us: list[float] = []
    for i in range(args.requests):
        # a shared system prompt, then the user's own turn
        tokens = pool[i % args.pool] + list(
            range(
                900_000_000 + i * 10_000, 900_000_000 + i * 10_000 + (args.prompt_blocks - PREFIX_BLOCKS) * BS
            )
        )
        t = time.perf_counter()
        chain = content_chain(tokens, BS)
        chain_us.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        found = index.longest(chain)
        lookup_us.append((time.perf_counter() - t) * 1e6)
        request = RouteRequest("m", {}, {"prompt": tokens})
        t = time.perf_counter()
        holders.held(request, endpoints)
        held_us.append((time.perf_counter() - t) * 1e6)
        assert all(n == PREFIX_BLOCKS for n in found.values())
    for name, xs in (
        ("content chain", chain_us),
        ("longest prefix", lookup_us),
        ("held over every endpoint", held_us),
    ):
        xs.sort()
        print(f"{name}: p50 {statistics.median(xs):,.0f} us, p99 {xs[int(len(xs) * 0.99) - 1]:,.0f} us")
    if args.blocks < 100_000:
        per_block = grown / max(index.blocks, 1)
        print(
            f"at 100k blocks per engine: {per_block * args.engines * 100_000 / 2**30:,.1f} GiB unbounded; "
            f"the router's default cap ({DEFAULT_TOTAL_BLOCKS:,} blocks in all) holds it to "
            f"{per_block * DEFAULT_TOTAL_BLOCKS / 2**30:,.2f} GiB (the largest engines' oldest dropped)"
        )


if __name__ == "__main__":
    main()
