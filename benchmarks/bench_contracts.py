"""Wire-model benchmark: what typing Corral's own contracts costs where the router pays for it.

The router decodes every line of every supervisor's watch stream (a state event carrying a drain report
as evidence, or a heartbeat), encodes an acknowledgement for each removal, and renders and parses
`/v1/fleet`. Each is timed three ways, in one process, interleaved in rounds:

    baseline  orjson plus the hand checks the code did before the contracts (the router's `_apply`,
              the ack dict, `RouterAdmin.endpoints`, the `/v1/fleet` list of dicts)
    pydantic  `corral.contracts` (pydantic v2, a dependency already)
    msgspec   the same shapes as `msgspec.Struct`s (only when msgspec is installed)

and printed as operations per second (median of rounds) and as a ratio to the baseline.

    .venv/bin/python benchmarks/bench_contracts.py [--endpoints 16] [--rounds 7] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from corral.contracts.router import FleetEndpoint, RouterFleet, SupervisorLink
from corral.contracts.supervisor import AckRequest, StateLine, decode_watch_line
from corral.engine_state import EngineState

try:
    import msgspec
except ImportError:  # pragma: no cover - the comparison is optional
    msgspec = None


def drain_report() -> dict[str, Any]:
    """The evidence of a DRAINING→SLEEPING event: a drain report with two routers' acks."""
    ack = {
        "router_id": "router-a-1234",
        "epoch": 41,
        "received": 1764760000.5,
        "latency_s": 0.0021,
        "state": "DRAINING",
        "removal_latency_s": 0.00004,
        "undispatched": 0,
    }
    return {
        "policy": "wait",
        "removal_epoch": 41,
        "in_flight_at_start": 12,
        "in_flight_at_end": 0,
        "waited_s": 1.734,
        "aborted": 0,
        "routers": {
            "epoch": 41,
            "acknowledged": [ack, {**ack, "router_id": "router-b-99"}],
            "gone": [],
            "missing": [],
            "complete_after_s": 0.004,
        },
        "quiet_period_s": 0.5,
    }


def state_line() -> bytes:
    return orjson.dumps(
        {
            "type": "state",
            "epoch": 42,
            "from": "DRAINING",
            "to": "SLEEPING",
            "state": "SLEEPING",
            "sub_state": None,
            "ready": False,
            "reason": "sleep level 1: drained, engine asleep",
            "evidence": drain_report(),
            "time": 1764760001.25,
            "since": 1764760001.25,
        }
    )


def fleet_endpoint(i: int) -> dict[str, Any]:
    return {
        "url": f"http://10.0.0.{i}:8000",
        "source": "k8s",
        "name": f"serving/engine-{i}",
        "state": "READY",
        "reason": "supervisor: READY",
        "since": 1764760000.0 + i,
        "last_event_resource_version": str(1000 + i),
        "models": ["Qwen/Qwen2.5-0.5B-Instruct", "sql-lora"],
        "in_flight": i % 5,
        "requests_sent": 1000 * i,
        "ejected_until": None,
        "routable": True,
        "why": "routable",
        "supervisor": {
            "url": f"http://10.0.0.{i}:8081",
            "stream": "connected",
            "stream_reason": "state stream open",
            "state": "READY",
            "sub_state": None,
            "reason": "engine ready",
            "epoch": 12,
            "heard_seconds_ago": 0.412,
            "acked_epoch": 10,
            "acks_sent": 3,
        },
    }


def fleet_body(n: int) -> dict[str, Any]:
    return {
        "policy": "least_request",
        "router_id": "router-a-1234",
        "source": "k8s",
        "endpoints": [fleet_endpoint(i) for i in range(n)],
        "left_routing": [],
    }


# -- baseline: what the code did by hand ------------------------------------------------------------


def baseline_watch(raw: bytes) -> Any:
    line = orjson.loads(raw)
    if not isinstance(line, dict) or line.get("type") != "state":
        return None
    epoch = int(line["epoch"])
    state = EngineState(line["state"])
    sub_state = line.get("sub_state") if isinstance(line.get("sub_state"), str) else None
    reason = str(line.get("reason", ""))
    event_time = line.get("time")
    when = float(event_time) if isinstance(event_time, int | float) else None
    evidence = line.get("evidence")
    listed = evidence.get("withdrawn_adapters") if isinstance(evidence, dict) else None
    withdrawn = (
        frozenset(m for m in listed if isinstance(m, str)) if isinstance(listed, list) else frozenset()
    )
    return epoch, state, sub_state, reason, when, withdrawn


def baseline_ack() -> bytes:
    body = {
        "router_id": "router-a-1234",
        "epoch": 42,
        "state": EngineState.SLEEPING.value,
        "removal_latency_s": 0.00004,
        "undispatched": 0,
    }
    return orjson.dumps(body)


def baseline_fleet_parse(raw: bytes) -> Any:
    body = orjson.loads(raw)
    endpoints = body.get("endpoints", []) if isinstance(body, dict) else body
    listed = [e for e in endpoints if isinstance(e, dict)] if isinstance(endpoints, list) else []
    return {str(e["url"]): e for e in listed}


def baseline_fleet_render(rows: list[dict[str, Any]]) -> bytes:
    endpoints = [
        {**{k: v for k, v in row.items() if k != "supervisor"}, "supervisor": dict(row["supervisor"])}
        for row in rows
    ]
    return orjson.dumps(
        {"policy": "least_request", "router_id": "r", "source": "k8s", "endpoints": endpoints}
    )


# -- pydantic: corral.contracts -----------------------------------------------------------------------


def pydantic_watch(raw: bytes) -> Any:
    return decode_watch_line(raw)


def pydantic_ack() -> bytes:
    return AckRequest(
        router_id="router-a-1234",
        epoch=42,
        state=EngineState.SLEEPING,
        removal_latency_s=0.00004,
        undispatched=0,
    ).encode()


def pydantic_fleet_parse(raw: bytes) -> Any:
    return RouterFleet.from_body(orjson.loads(raw)).by_url()


def pydantic_fleet_render(rows: list[dict[str, Any]]) -> bytes:
    endpoints = [
        FleetEndpoint(
            **{k: v for k, v in row.items() if k != "supervisor"},
            supervisor=SupervisorLink(**row["supervisor"]),
        )
        for row in rows
    ]
    return RouterFleet(policy="least_request", router_id="r", source="k8s", endpoints=endpoints).encode()


# -- msgspec: the same shapes (module level: the annotations name each other) ------------------

if msgspec is not None:

    class MState(msgspec.Struct, rename={"from_": "from"}):
        epoch: int
        state: EngineState
        type: str = "state"
        from_: str | None = None
        to: str | None = None
        sub_state: str | None = None
        ready: bool = False
        reason: str = ""
        evidence: dict[str, Any] = msgspec.field(default_factory=dict)
        time: float | None = None
        since: float | None = None

    class MAck(msgspec.Struct):
        router_id: str
        epoch: int
        state: EngineState | None = None
        removal_latency_s: float | None = None
        undispatched: int = 0

    class MLink(msgspec.Struct):
        url: str
        stream: str = "connecting"
        stream_reason: str = ""
        state: EngineState | None = None
        sub_state: str | None = None
        reason: str = ""
        epoch: int | None = None
        heard_seconds_ago: float | None = None
        acked_epoch: int | None = None
        acks_sent: int = 0

    class MEndpoint(msgspec.Struct):
        url: str
        source: str = ""
        name: str | None = None
        state: EngineState = EngineState.STARTING
        reason: str = ""
        since: float | None = None
        last_event_resource_version: str | None = None
        models: list[str] = msgspec.field(default_factory=list)
        in_flight: int = 0
        requests_sent: int = 0
        ejected_until: float | None = None
        routable: bool = False
        why: str = ""
        supervisor: MLink | None = None

    class MFleet(msgspec.Struct):
        policy: str = ""
        router_id: str | None = None
        source: str = ""
        endpoints: list[MEndpoint] = msgspec.field(default_factory=list)
        left_routing: list[dict[str, Any]] = msgspec.field(default_factory=list)


def msgspec_cases() -> dict[str, Callable[..., Any]]:
    if msgspec is None:
        return {}

    state_decoder = msgspec.json.Decoder(MState)
    fleet_decoder = msgspec.json.Decoder(MFleet)
    encoder = msgspec.json.Encoder()

    def watch(raw: bytes) -> Any:
        return state_decoder.decode(raw)

    def ack() -> bytes:
        return encoder.encode(MAck("router-a-1234", 42, EngineState.SLEEPING, 0.00004, 0))

    def fleet_parse(raw: bytes) -> Any:
        return {e.url: e for e in fleet_decoder.decode(raw).endpoints}

    def fleet_render(rows: list[dict[str, Any]]) -> bytes:
        endpoints = [
            MEndpoint(
                **{k: v for k, v in row.items() if k != "supervisor"},
                supervisor=MLink(**row["supervisor"]),
            )
            for row in rows
        ]
        return encoder.encode(MFleet("least_request", "r", "k8s", endpoints))

    return {"watch": watch, "ack": ack, "fleet_parse": fleet_parse, "fleet_render": fleet_render}


def rate(fn: Callable[[], Any], seconds: float) -> float:
    """Calls per second of `fn` over about `seconds`."""
    n, batch = 0, 64
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        n += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=16, help="endpoints in the /v1/fleet body")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3, help="per case per round")
    args = parser.parse_args()

    line = state_line()
    fleet_raw = orjson.dumps(fleet_body(args.endpoints))
    rows = [fleet_endpoint(i) for i in range(args.endpoints)]
    # the typed readers see what the baseline sees
    assert isinstance(decode_watch_line(line), StateLine)
    assert set(pydantic_fleet_parse(fleet_raw)) == set(baseline_fleet_parse(fleet_raw))

    fast = msgspec_cases()
    cases: dict[str, dict[str, Callable[[], Any]]] = {
        "watch line decode+validate": {
            "baseline": lambda: baseline_watch(line),
            "pydantic": lambda: pydantic_watch(line),
        },
        "ack encode": {"baseline": baseline_ack, "pydantic": pydantic_ack},
        f"/v1/fleet parse ({args.endpoints} endpoints)": {
            "baseline": lambda: baseline_fleet_parse(fleet_raw),
            "pydantic": lambda: pydantic_fleet_parse(fleet_raw),
        },
        f"/v1/fleet render ({args.endpoints} endpoints)": {
            "baseline": lambda: baseline_fleet_render(rows),
            "pydantic": lambda: pydantic_fleet_render(rows),
        },
    }
    if fast:
        names = list(cases)
        cases[names[0]]["msgspec"] = lambda: fast["watch"](line)
        cases[names[1]]["msgspec"] = fast["ack"]
        cases[names[2]]["msgspec"] = lambda: fast["fleet_parse"](fleet_raw)
        cases[names[3]]["msgspec"] = lambda: fast["fleet_render"](rows)

    print(
        f"watch line: {len(line)} bytes; /v1/fleet: {len(fleet_raw)} bytes; {args.rounds} rounds, interleaved"
    )
    print(f"{'case':42} {'library':9} {'ops/s':>12} {'µs/op':>9} {'vs baseline':>12}")
    for case, runs in cases.items():
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, fn in runs.items():
                samples[name].append(rate(fn, args.seconds))
        base = statistics.median(samples["baseline"])
        for name, got in samples.items():
            ops = statistics.median(got)
            print(f"{case:42} {name:9} {ops:12,.0f} {1e6 / ops:9.2f} {ops / base:11.2f}x")


if __name__ == "__main__":
    main()
