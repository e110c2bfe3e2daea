"""The endpoint picker's decision cost beside the router's own pick, at 10 and 1,000 endpoints.

For each fleet size and policy (least_request, prefix), on cores built alike (tests.support.epp_fleet: N
endpoints READY in a router core, no engine behind them), the same requests are picked three ways:

- `router pick`: the router's seam as its proxy calls it, the body parsed as the proxy parses it, then
  the eligible set and the policy, and the endpoint's in-flight accounting (Dispatch) taken and released;
- `epp exchange`: one whole ext_proc exchange through the picker's `Exchange` in process (headers, body
  read and parsed, the pick, the answer protos, the response phases, the release), no network;
- `epp grpc`: the same exchange over real gRPC on loopback (grpc.aio server and client in this process,
  one exchange at a time), so the figure includes both ends of the protocol.

Reported: latency p50 and p99 per request (µs) and CPU per request (process CPU time / requests, µs),
and each EPP row's ratio to the router pick's p50 measured in the same run. Bounded: `--requests` per
row (default 2,000), loopback only.

    .venv/bin/python benchmarks/bench_epp.py [--requests 2000] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.epp_fleet import MODEL, epp_pick, messages, ready_core

from corral.epp.decision import Picker
from corral.epp.server import ExternalProcessor
from corral.router.datapath.dispatch import Dispatch
from corral.router.routing.request import RouteRequest

SIZES = (10, 1000)
POLICIES = ("least_request", "prefix")


def bodies(count: int) -> list[dict[str, object]]:
    return [
        {
            "model": MODEL,
            "prompt": f"system prompt {i % 50}: " + "context " * 200 + f"question {i}",
            "max_tokens": 8,
        }
        for i in range(count)
    ]


def summary(name: str, size: int, policy: str, latencies: list[float], cpu: float) -> dict[str, object]:
    latencies.sort()
    return {
        "path": name,
        "endpoints": size,
        "policy": policy,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99) - 1] * 1e6,
        "cpu_us": cpu / len(latencies) * 1e6,
    }


async def timed(
    run: Callable[[dict[str, object]], Awaitable[object]], work: list[dict[str, object]]
) -> tuple[list[float], float]:
    latencies = []
    cpu = time.process_time()
    for body in work:
        start = time.perf_counter()
        await run(body)
        latencies.append(time.perf_counter() - start)
    return latencies, time.process_time() - cpu


async def row_set(size: int, policy: str, requests: int) -> list[dict[str, object]]:
    work = bodies(requests)
    rows = []

    core = ready_core(size, policy)

    async def router(body: dict[str, object]) -> object:
        payload = orjson.loads(orjson.dumps(body))  # the proxy parses the body it read
        route = RouteRequest(MODEL, {}, payload)
        endpoint = core.routing.policy.pick(core.membership.eligible(MODEL), route)
        Dispatch(endpoint, route.prefill_tokens).release()
        return endpoint

    rows.append(summary("router pick", size, policy, *await timed(router, work)))

    epp_core = ready_core(size, policy)
    picker = Picker(epp_core)

    async def exchange(body: dict[str, object]) -> object:
        return await epp_pick(epp_core, picker, body)

    rows.append(summary("epp exchange", size, policy, *await timed(exchange, work)))

    grpc_core = ready_core(size, policy)
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(
        ExternalProcessor(Picker(grpc_core), grpc_core, 1 << 24), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = ext_proc_grpc.ExternalProcessorStub(channel)

    async def over_grpc(body: dict[str, object]) -> object:
        call = stub.Process()
        sent = messages(body)
        await call.write(sent[0])
        await call.write(sent[1])
        picked = await call.read()  # the pick (then the body handed back)
        await call.read()
        for message in sent[2:]:
            await call.write(message)
            await call.read()
        await call.done_writing()
        return picked

    try:
        rows.append(summary("epp grpc", size, policy, *await timed(over_grpc, work)))
    finally:
        await channel.close()
        await server.stop(0)
    base = float(rows[0]["p50_us"])  # type: ignore[arg-type]
    for row in rows:
        row["x_router_p50"] = float(row["p50_us"]) / base  # type: ignore[arg-type]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    requests = max(100, min(args.requests, 20_000))
    rows: list[dict[str, object]] = []
    for size in SIZES:
        for policy in POLICIES:
            rows.extend(asyncio.run(row_set(size, policy, requests)))
    if args.markdown:
        print("| endpoints | policy | path | p50 µs | p99 µs | CPU µs/request | p50 vs router pick |")
        print("|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        if args.markdown:
            print(
                f"| {r['endpoints']} | {r['policy']} | {r['path']} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | "
                f"{r['cpu_us']:.0f} | {r['x_router_p50']:.1f}x |"
            )
        else:
            print(r)


if __name__ == "__main__":
    main()
