"""A confirmed drain: two `corral router` replicas follow the state streams of two supervised engines
(`--supervised ENGINE=SUPERVISOR`) under continuous streamed load split across both routers; a drain
of one supervisor is acknowledged by both routers before its policy step, no client request fails
before streaming, and nothing reaches the drained engine after the last acknowledgement.

"Nothing reaches the engine" is checked from the engine's side, twice: (1) its own admission count
(running + waiting + finished, from its /metrics, sampled every few milliseconds in a thread) does
not grow after the first sample taken after the last acknowledgement; (2) no request that the
drained engine answered (its `system_fingerprint` differs per engine seed) was sent by a client
after the last acknowledgement.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from corral.engine.load_sample import parse_load
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.streams import stream_once

ENGINE_ARGS = ("--itl-ms", "10", "--shutdown-timeout", "8")
DRAIN_ARGS = (
    "--propagation-timeout",
    "5",
    "--quiet-period",
    "0.5",
    "--drain-timeout",
    "15",
    "--shutdown-timeout",
    "10",
)
WORKERS_PER_ROUTER = 12


@dataclass
class Sent:
    sent_at: float  # time.time() just before the request left the client
    router: str
    fingerprint: str | None = None


@dataclass
class Outcomes:
    completed: int = 0
    failed_before_stream: list[str] = field(default_factory=list)
    broken_streams: list[str] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)


async def one_stream(session: aiohttp.ClientSession, router_url: str, out: Outcomes) -> None:
    body = {
        "model": "sim-model",
        "prompt": "tell me about confirmed drains",
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    record = Sent(time.time(), router_url)
    out.sent.append(record)
    outcome = await stream_once(session, router_url + "/v1/completions", body)
    if outcome.kind == "failed_before_stream":
        out.failed_before_stream.append(outcome.detail)
        return
    if outcome.kind == "broken":
        out.broken_streams.append(outcome.detail)
        return
    for payload in outcome.payloads():
        if payload.get("system_fingerprint"):
            record.fingerprint = payload["system_fingerprint"]
    out.completed += 1


async def load(router_urls: list[str], out: Outcomes, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker(router_url: str) -> None:
            while not stop.is_set():
                await one_stream(session, router_url, out)

        await asyncio.gather(*(worker(url) for url in router_urls for _ in range(WORKERS_PER_ROUTER)))


class AdmissionSampler(threading.Thread):
    """Polls the engine's /metrics as fast as it answers: (time.time() before the request, admitted)."""

    def __init__(self, engine_url: str) -> None:
        super().__init__(daemon=True)
        self.engine_url = engine_url
        self.samples: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.time()
            try:
                with urllib.request.urlopen(self.engine_url + "/metrics", timeout=1.0) as resp:
                    text = resp.read().decode()
            except OSError:
                time.sleep(0.005)
                continue
            self.samples.append((started, parse_load(text).admitted))
            time.sleep(0.002)


def start_router(name: str, sups: list[Supervised]) -> tuple[CorralProcess, str]:
    port = free_port()
    pairs = [arg for sup in sups for arg in ("--supervised", f"{sup.engine_url}={sup.url}")]
    proc = CorralProcess(
        [
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--router-id",
            name,
            "--supervisor-heartbeat",
            "0.5",
            "--policy",
            "round_robin",
            *pairs,
        ]
    )
    return proc, f"http://127.0.0.1:{port}"


def fleet(router_url: str) -> dict[str, Any]:
    return http_json(router_url + "/v1/fleet")[1]


def all_routable(router_url: str) -> bool:
    endpoints = fleet(router_url)["endpoints"]
    return len(endpoints) == 2 and all(
        e["routable"] and e["supervisor"]["stream"] == "connected" for e in endpoints
    )


async def wait_until(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not {what} after {within}s")


async def test_drain_is_confirmed_by_both_routers_and_nothing_arrives_after_the_last_ack() -> None:
    sups = [
        start_supervised(sim_args=(*ENGINE_ARGS, "--seed", str(i)), sup_args=DRAIN_ARGS) for i in range(2)
    ]
    routers: list[tuple[CorralProcess, str]] = []
    sampler: AdmissionSampler | None = None
    try:
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        routers = [start_router(name, sups) for name in ("router-a", "router-b")]
        for proc, url in routers:
            await asyncio.to_thread(proc.wait_http, url + "/health")
        router_urls = [url for _, url in routers]
        for url in router_urls:
            await wait_until(lambda url=url: all_routable(url), 15, f"both endpoints routable via {url}")
        victim = sups[0]
        await wait_until(
            lambda: victim.state()["routers"]["subscribed"].keys() == {"router-a", "router-b"},
            10,
            "both routers subscribed",
        )

        sampler = AdmissionSampler(victim.engine_url)
        sampler.start()
        out, stop = Outcomes(), asyncio.Event()
        load_task = asyncio.create_task(load(router_urls, out, stop))
        await wait_until(
            lambda: len({s.fingerprint for s in out.sent if s.fingerprint}) == 2,
            60,
            "answers from both engines",
        )
        assert out.completed > 0 and not out.failed_before_stream, out.failed_before_stream[:3]
        fingerprints = {s.fingerprint for s in out.sent if s.fingerprint}
        assert len(fingerprints) == 2, f"load did not reach both engines: {fingerprints}"

        status, op = await asyncio.to_thread(http_json, victim.url + "/v1/drain", "POST", {})
        assert status == 202, op
        report = await asyncio.to_thread(victim.wait_for, "drained", lambda b: b.get("drain") is not None, 40)
        drained_at = time.time()  # after the last acknowledgement (the drain waited for it)
        # load goes on against the survivor after the drain
        await wait_until(
            lambda: sum(1 for s in out.sent if s.sent_at > drained_at and s.fingerprint) >= 12,
            60,
            "answers after the drain",
        )
        stop.set()
        await asyncio.wait_for(load_task, 60)
        sampler.halt.set()
        sampler.join(5)

        records = victim.oplog()
        removal = next(
            i
            for i, r in enumerate(records)
            if r["record"] == "transition" and r["sub_state"] == "leaving_routing"
        )
        removal_epoch = records[removal]["epoch"]
        policy_step = next(
            i
            for i, r in enumerate(records)
            if r["record"] == "transition" and r["sub_state"] in ("waiting_in_flight", "aborting")
        )
        acks = [(i, r) for i, r in enumerate(records) if r["record"] == "ack" and r["epoch"] >= removal_epoch]
        # both routers acknowledged the removal, and the log shows it before the policy step
        assert {r["router_id"] for _, r in acks} == {"router-a", "router-b"}, acks
        assert all(removal < i < policy_step for i, _ in acks), (removal, policy_step, acks)
        drain = report["drain"]
        assert {a["router_id"] for a in drain["routers_acknowledged"]} == {"router-a", "router-b"}
        assert drain["routers_missing"] == [] and drain["routers_gone"] == []
        assert all(r["undispatched"] == 0 for _, r in acks), acks

        # no client request failed before streaming; no stream broke
        assert out.failed_before_stream == [], out.failed_before_stream[:5]
        assert out.broken_streams == [], out.broken_streams[:5]

        # nothing reached the drained engine after the last acknowledgement
        last_ack = max(r["time"] for _, r in acks)
        after = [admitted for at, admitted in sampler.samples if at >= last_ack]
        assert after, "no engine sample after the last acknowledgement"
        assert max(after) == after[0], (
            f"the engine admitted {max(after) - after[0]:.0f} requests after the last acknowledgement"
        )
        # the simulator's fingerprint ends with a hash of model and seed; the victim runs seed 0
        victim_hash = hashlib.sha1(b"sim-model:0").hexdigest()[:8]
        (victim_fingerprint,) = [f for f in fingerprints if f.endswith(victim_hash)]
        late = [s for s in out.sent if s.fingerprint == victim_fingerprint and s.sent_at > last_ack]
        assert late == [], f"{len(late)} requests sent after the last ack were served by the drained engine"
        served_after = [s for s in out.sent if s.sent_at > last_ack and s.fingerprint]
        assert served_after, "no load after the last acknowledgement: the check proved nothing"

        for _, url in routers:
            metrics = await asyncio.to_thread(_text, url + "/metrics")
            assert 'corral_router_supervisor_acks_total{result="sent"}' in metrics
            assert "corral_router_supervisor_removal_latency_seconds_count 1.0" in metrics
            (drained,) = [e for e in fleet(url)["endpoints"] if e["url"] == victim.engine_url]
            assert not drained["routable"] and drained["supervisor"]["acked_epoch"] >= removal_epoch

        latencies = {r["router_id"]: r["latency_s"] for _, r in acks}
        print(f"\nack latency from the supervisor's DRAINING event: {latencies}")
        print(f"router-side removal latency: { {r['router_id']: r['removal_latency_s'] for _, r in acks} }")
        print(f"all acknowledged after {drain['acknowledged_after_s']}s; {out.completed} streams completed")
    finally:
        if sampler is not None:
            sampler.halt.set()
        for proc, _ in routers:
            proc.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def _subscribe(
    session: aiohttp.ClientSession, sup: Supervised, router_id: str
) -> aiohttp.ClientResponse:
    resp = await session.get(sup.url + "/v1/state/watch", params={"router_id": router_id, "heartbeat": "0.2"})
    assert resp.status == 200
    first = orjson.loads(await resp.content.readline())
    assert first["state"] == "READY"
    return resp


async def test_a_silent_subscriber_holds_the_drain_to_the_deadline_and_a_closed_one_is_gone() -> None:
    """Supervisor side alone: a subscriber that never acknowledges is waited for until the
    propagation deadline and reported missing; one whose stream closes mid-drain is counted gone."""
    sups = [
        start_supervised(
            sim_args=ENGINE_ARGS, sup_args=("--propagation-timeout", "3", "--quiet-period", "0.2")
        )
        for _ in range(2)
    ]
    try:
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        silent, leaving = sups
        async with aiohttp.ClientSession() as session:
            held = await _subscribe(session, silent, "silent-router")
            await asyncio.to_thread(http_json, silent.url + "/v1/drain", "POST", {})
            body = await asyncio.to_thread(
                silent.wait_for, "drained", lambda b: b.get("drain") is not None, 30
            )
            drain = body["drain"]
            assert drain["propagation_seconds"] >= 3.0  # held to the deadline, by the drain's own clock
            assert drain["routers_missing"] == ["silent-router"] and drain["routers_acknowledged"] == []
            held.close()

            closing = await _subscribe(session, leaving, "closing-router")
            await asyncio.to_thread(http_json, leaving.url + "/v1/drain", "POST", {})
            await asyncio.sleep(0.5)
            closing.close()
            body = await asyncio.to_thread(
                leaving.wait_for, "drained", lambda b: b.get("drain") is not None, 30
            )
            drain = body["drain"]
            assert drain["routers_gone"] == ["closing-router"] and drain["routers_missing"] == []
            assert drain["propagation_seconds"] < 3.0
            gone = [r for r in leaving.oplog() if r["record"] == "router_unsubscribed"]
            assert gone and gone[0]["awaited_epoch"] == drain["removal_epoch"]
    finally:
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
