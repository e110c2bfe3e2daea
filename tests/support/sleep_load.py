"""Runbook operations on one of two supervised `corral sim` engines while a `corral router`
(`--supervised ENGINE=SUPERVISOR`) carries continuous, bounded streamed load: start that fleet and the
load, run an operation to its end, and read what the engine admitted, what its /metrics say and what
the operation log recorded. No tests here."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from corral.engine.dev_api import EngineFigures, parse_figures
from tests.integration.test_supervisor_confirmed_drain import (
    AdmissionSampler,
    Outcomes,
    all_routable,
    one_stream,
    start_router,
    wait_until,
)
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
GIB = 2**30
SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", "--itl-ms", "10")
SUP_ARGS = ("--propagation-timeout", "5", "--quiet-period", "0.5", "--drain-timeout", "15")
STEPS = ["precheck", "remove_from_routing", "drain_policy", "execute", "verify", "postcheck"]
ROUTER_ID = "router-a"
LOAD_WORKERS = 12
LOAD_MAX_REQUESTS = 6000  # far more than a test sends; reaching it means the load ended early
LOAD_MAX_SECONDS = 90.0


def run_op(sup: Supervised, path: str, body: dict[str, Any], want: str = "succeeded") -> dict[str, Any]:
    """POST an operation to the supervisor and wait until it is no longer running; it must end `want`."""
    status, op = http_json(sup.url + path, "POST", body)
    assert status == 202, op
    return finish_op(sup, op["operation_id"], want)


def finish_op(sup: Supervised, op_id: str, want: str = "succeeded") -> dict[str, Any]:
    final = sup.wait_for(
        f"{op_id} finished",
        lambda b: any(o["operation_id"] == op_id and o["status"] != "running" for o in b["operations"]),
        60,
    )
    (done,) = [dict(o) for o in final["operations"] if o["operation_id"] == op_id]
    assert done["status"] == want, done
    return done


def step_records(sup: Supervised, op_id: str) -> list[dict[str, Any]]:
    return [r for r in sup.oplog() if r["record"] == "runbook_step" and r["operation_id"] == op_id]


def steps(sup: Supervised, op_id: str) -> list[tuple[str, str]]:
    return [(r["step"], r["status"]) for r in step_records(sup, op_id)]


def evidence(sup: Supervised, op_id: str, step: str) -> dict[str, Any]:
    (record,) = [r for r in step_records(sup, op_id) if r["step"] == step]
    return dict(record["evidence"])


def not_ready_window(sup: Supervised, removal_op: str, ready_after: float) -> tuple[float, float]:
    """(the router's last ack of `removal_op`'s removal epoch, the next READY transition after
    `ready_after`), supervisor clock: the stretch in which nothing may reach the engine."""
    records = sup.oplog()
    removal = next(r for r in step_records(sup, removal_op) if r["step"] == "remove_from_routing")
    epoch = removal["evidence"]["removal_epoch"]
    assert removal["evidence"]["routers_acknowledged"] == [ROUTER_ID], removal
    ready_event = min(
        (
            r
            for r in records
            if r["record"] == "transition" and r["state"] == "READY" and r["time"] > ready_after
        ),
        key=lambda r: r["time"],
    )
    last_ack = max(
        r["time"] for r in records if r["record"] == "ack" and epoch <= r["epoch"] < ready_event["epoch"]
    )
    return last_ack, ready_event["time"]


def window_arrivals(sup: Supervised, sampler: AdmissionSampler, removal_op: str, ready_after: float) -> float:
    """Requests the engine admitted between the last router ack of `removal_op`'s removal epoch and its
    next READY transition."""
    last_ack, ready = not_ready_window(sup, removal_op, ready_after)
    seen = [admitted for at, admitted in sampler.samples if last_ack <= at <= ready]
    assert len(seen) >= 2, "too few engine samples in the window"
    return max(seen) - seen[0]


@dataclass(frozen=True)
class EngineReading:
    """One scrape of the engine's /metrics: `vllm:engine_sleep_state` by its label, the simulated
    scheduler pause, and the sleep and memory figures the supervisor's VERIFY reads."""

    sleep_state: dict[str, float]
    scheduler_paused: float | None
    figures: EngineFigures


def read_engine(engine_url: str) -> EngineReading:
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    sleep_state: dict[str, float] = {}
    paused: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:engine_sleep_state":
                sleep_state[sample.labels["sleep_state"]] = sample.value
            elif sample.name == "corral_sim_scheduler_paused":
                paused = sample.value
    return EngineReading(sleep_state, paused, parse_figures(text))


def sleep_gauge(label: str | None) -> dict[str, float]:
    """`vllm:engine_sleep_state` with `label` set (all three 0 when None: a level-0 pause)."""
    return {s: 1.0 if s == label else 0.0 for s in ("awake", "weights_offloaded", "discard_all")}


def served_models(engine_url: str) -> list[str]:
    return [m["id"] for m in http_json(engine_url + "/v1/models")[1]["data"]]


@dataclass
class LoadedFleet:
    """Two supervised engines behind one router; `victim` is the one the operations run on."""

    sups: list[Supervised]
    router: CorralProcess
    url: str
    sampler: AdmissionSampler
    out: Outcomes = field(default_factory=Outcomes)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    load_task: asyncio.Task[None] | None = None

    @property
    def victim(self) -> Supervised:
        return self.sups[0]

    @property
    def victim_fingerprint(self) -> str:
        """The `system_fingerprint` the victim (seed 0) answers with."""
        victim_hash = hashlib.sha1(b"sim-model:0").hexdigest()[:8]
        (fingerprint,) = [f for f in self.fingerprints_sent_after(0.0) if f.endswith(victim_hash)]
        return fingerprint

    def victim_answered(self, start: float, end: float) -> int:
        """Requests sent between `start` and `end` (client clock) that the victim answered."""
        victim = self.victim_fingerprint
        return sum(1 for s in self.out.sent if start <= s.sent_at <= end and s.fingerprint == victim)

    def fingerprints_sent_after(self, at: float) -> set[str]:
        return {s.fingerprint for s in self.out.sent if s.fingerprint and s.sent_at > at}

    def sent_between(self, start: float, end: float) -> int:
        return sum(1 for s in self.out.sent if start <= s.sent_at <= end)

    async def answered_after(self, at: float, count: int) -> None:
        """Wait until `count` requests sent after `at` were answered."""
        await wait_until(
            lambda: sum(1 for s in self.out.sent if s.fingerprint and s.sent_at > at) >= count,
            15,
            f"{count} requests answered",
        )

    async def both_engines_serve_after(self, at: float) -> None:
        """Wait until requests sent after `at` were answered by both engines."""
        await wait_until(lambda: len(self.fingerprints_sent_after(at)) == 2, 15, "both engines answering")

    async def routable(self, what: str) -> None:
        await wait_until(lambda: all_routable(self.url), 15, what)

    async def end_load(self) -> Outcomes:
        """Stop the load, wait for the requests in flight, and check none failed."""
        self.stop.set()
        assert self.load_task is not None
        await asyncio.wait_for(self.load_task, 60)
        self.sampler.halt.set()
        await asyncio.to_thread(self.sampler.join, 5)
        out = self.out
        assert out.failed_before_stream == [], out.failed_before_stream[:5]
        assert out.broken_streams == [], out.broken_streams[:5]
        assert out.completed > 0 and len(out.sent) < LOAD_MAX_REQUESTS, (out.completed, len(out.sent))
        return out


async def bounded_load(router_url: str, out: Outcomes, stop: asyncio.Event) -> None:
    """`LOAD_WORKERS` clients streaming back to back until `stop`, `LOAD_MAX_REQUESTS` or
    `LOAD_MAX_SECONDS`, whichever comes first."""
    deadline = time.monotonic() + LOAD_MAX_SECONDS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            while not stop.is_set() and len(out.sent) < LOAD_MAX_REQUESTS and time.monotonic() < deadline:
                await one_stream(session, router_url, out)

        await asyncio.gather(*(worker() for _ in range(LOAD_WORKERS)))


@contextlib.asynccontextmanager
async def loaded_fleet(
    victim_sim_args: tuple[str, ...] = (),
    victim_sup_args: tuple[str, ...] = (),
    victim_engine_port: int | None = None,
) -> AsyncIterator[LoadedFleet]:
    """Start the fleet, wait until the router routes to both engines and the victim's supervisor has the
    router subscribed, start the admission sampler on the victim and the load, and yield once both
    engines have answered load. Everything is stopped on the way out, the engines killed if need be."""
    sups: list[Supervised] = []
    router: CorralProcess | None = None
    sampler: AdmissionSampler | None = None
    fleet: LoadedFleet | None = None
    try:
        for i in range(2):
            extra, sup_extra = (victim_sim_args, victim_sup_args) if i == 0 else ((), ())
            sim_args = (*SIM_ARGS, "--seed", str(i), *extra)
            port = victim_engine_port if i == 0 else None
            sups.append(
                start_supervised(
                    sim_args=sim_args, sup_args=(*SUP_ARGS, *sup_extra), env=DEV, engine_port=port
                )
            )
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        router, url = start_router(ROUTER_ID, sups)
        await asyncio.to_thread(router.wait_http, url + "/health")
        await wait_until(lambda: all_routable(url), 15, "both endpoints routable")
        await wait_until(
            lambda: ROUTER_ID in sups[0].state()["routers"]["subscribed"], 10, "router subscribed"
        )
        sampler = AdmissionSampler(sups[0].engine_url)
        sampler.start()
        fleet = LoadedFleet(sups, router, url, sampler)
        fleet.load_task = asyncio.create_task(bounded_load(url, fleet.out, fleet.stop))
        await fleet.both_engines_serve_after(0.0)
        yield fleet
    finally:
        if fleet is not None and fleet.load_task is not None and not fleet.load_task.done():
            fleet.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(fleet.load_task, 60)
        if sampler is not None:
            sampler.halt.set()
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
