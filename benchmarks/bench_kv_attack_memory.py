"""The router's memory under a compromised engine's KV events (issue 27, finding 4): a real router
(`--policy prefix --tokenizer sim`) follows a hostile publisher (tests/support/hostile_kv.py: a ZMQ PUB and
replay ROUTER speaking vLLM's batch format) standing in for one `corral sim` engine's events, which sends
10,000 distinct LoRA names, then 10,000 blocks with 16 KiB hashes, then clears its cache and leaves
membership. The router's RSS (psutil) is printed after each step, with the bound it must stay under.

    .venv/bin/python benchmarks/bench_kv_attack_memory.py
    PYTHONPATH=/tmp/corral-main/src .venv/bin/python benchmarks/bench_kv_attack_memory.py   # before
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.hostile_kv import HostilePublisher, batch_payload, stored_event
from tests.support.procs import CorralProcess, free_port, start_sim

MIB = 1 << 20
BOUND_GROWTH_MIB = 32  # the router's RSS over its start, at any step of the attack


def _feed(url: str, engine: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=5.0) as resp:
        endpoints = {e["url"]: e for e in orjson.loads(resp.read())["endpoints"]}
    return (endpoints.get(engine) or {}).get("kv_events") or {}


def _settle(url: str, engine: str, last: int, timeout: float = 60.0) -> dict[str, Any]:
    """Until the feed applied or refused up to batch `last` (or refused anything since `refused`)."""
    deadline = time.monotonic() + timeout
    feed: dict[str, Any] = {}
    while time.monotonic() < deadline:
        feed = _feed(url, engine)
        if (feed.get("last_seq") or -1) >= last or feed.get("refused"):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # let the allocator settle before reading RSS
    return feed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--blocks", type=int, default=10_000)
    args = parser.parse_args()
    hostile = HostilePublisher(free_port(), free_port())
    sim, sim_url = start_sim(None, "--seed", "0", "--max-model-len", "2048")
    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-attack-"))
    backends = tmp / "backends"
    backends.write_text(f"{sim_url} kv_events={hostile.address}\n")
    port = free_port()
    router = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--backends-file", str(backends),
         "--models-refresh-seconds", "0.5", "--policy", "prefix", "--tokenizer", "sim"]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc = psutil.Process(router.pid)
    rows: list[tuple[str, float, str]] = []

    def measure(step: str, feed: dict[str, Any]) -> None:
        # the router's process and any it started (`corral router` may serve from a child)
        rss = sum(p.memory_info().rss for p in (proc, *proc.children(recursive=True))) / MIB
        index = feed.get("index") or {}
        rows.append((step, rss, f"blocks={index.get('blocks')} refused={feed.get('refused', '-')}"))
        print(f"{step:<44} RSS {rss:7.1f} MiB   {rows[-1][2]}", flush=True)

    try:
        router.wait_http(url + "/v1/fleet")
        while not _feed(url, sim_url):
            time.sleep(0.2)
        seq = hostile.publish(batch_payload(stored_event([1], list(range(16)), 16)))
        measure("start (one honest block)", _settle(url, sim_url, seq))
        for start in range(0, args.names, 100):
            events = [
                stored_event([10_000 + n], [1, 2], 16, lora=f"adapter-{n:06d}-" + "n" * 40)
                for n in range(start, min(start + 100, args.names))
            ]
            seq = hostile.publish(batch_payload(*events))
        measure(f"{args.names} LoRA names (no whole block)", _settle(url, sim_url, seq))
        big = b"\xab" * (16 << 10)
        for start in range(0, args.blocks, 100):
            hashes = [big[:-8] + n.to_bytes(8, "big") for n in range(start, min(start + 100, args.blocks))]
            seq = hostile.publish(batch_payload(stored_event(hashes, list(range(16 * len(hashes))), 16)))
        measure(f"{args.blocks} blocks with 16 KiB hashes", _settle(url, sim_url, seq))
        hostile.clear()
        seq = hostile.publish(batch_payload({"type": "AllBlocksCleared"}))
        measure("AllBlocksCleared", _settle(url, sim_url, seq, timeout=15.0))
        backends.write_text(f"{sim_url}\n")  # the engine stops publishing: its feed and index forgotten
        deadline = time.monotonic() + 15
        while _feed(url, sim_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        measure("feed forgotten", {})
        growth = max(rss for _, rss, _ in rows) - rows[0][1]
        verdict = "within" if growth < BOUND_GROWTH_MIB else "OVER"
        print(f"peak growth {growth:.1f} MiB: {verdict} the bound of {BOUND_GROWTH_MIB} MiB over the start")
    finally:
        router.stop()
        sim.stop()
        hostile.close()


if __name__ == "__main__":
    main()
