"""A serving group under load: two supervised `corral sim` engines in one group (`group=g0/2` in the
router's backends file) and one engine outside any group, behind one `corral router`, with bounded
streamed load and a sampler of each engine's own admission count. Tests fail a member and read, from
the engines' side, what reached them after the router acknowledged the removal. No tests here."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from corral.engine.load_sample import parse_load
from tests.integration.test_supervisor_confirmed_drain import Outcomes, one_stream, wait_until
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port

ROUTER_ID = "router-g"
SIM_ARGS = ("--itl-ms", "10")
SUP_ARGS: tuple[str, ...] = ()  # start_supervised already restarts after 0.2 s
LOAD_WORKERS = 8
LOAD_MAX_REQUESTS = 5000  # far more than a test sends; reaching it means the load ran away
LOAD_MAX_SECONDS = 120.0
SAMPLE_EVERY = 0.01


class AdmissionSampler(threading.Thread):
    """Polls one engine's /metrics: (time.time() before the request, admitted or None when the engine
    did not answer — down, or restarting)."""

    def __init__(self, engine_url: str) -> None:
        super().__init__(daemon=True)
        self.engine_url = engine_url
        self.samples: list[tuple[float, float | None]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.time()
            try:
                with urllib.request.urlopen(self.engine_url + "/metrics", timeout=1.0) as resp:
                    text = resp.read().decode()
                self.samples.append((started, parse_load(text).admitted))
            except OSError:
                self.samples.append((started, None))
            time.sleep(SAMPLE_EVERY)

    def growth(self, start: float, end: float) -> tuple[float, int]:
        """(how much the admission count grew, samples read) between `start` and `end`, on the engine
        process that answered the first sample after `start`: counting stops at the first sample it
        did not answer (a new process counts from zero, and its supervisor's smoke request is not a
        routed one)."""
        seen: list[float] = []
        for at, admitted in self.samples:
            if at < start or at > end:
                continue
            if admitted is None:
                break
            seen.append(admitted)
        return (max(seen) - seen[0], len(seen)) if seen else (0.0, 0)


def seed_fingerprint(seed: int) -> str:
    """The tail of the `system_fingerprint` the simulator with `seed` answers with."""
    return hashlib.sha1(f"sim-model:{seed}".encode()).hexdigest()[:8]


@dataclass
class GroupFleet:
    """`members` (seeds 0 and 1) form group g0; `loner` (seed 2) is in no group."""

    members: list[Supervised]
    loner: Supervised
    router: CorralProcess
    url: str
    samplers: dict[str, AdmissionSampler]
    out: Outcomes = field(default_factory=Outcomes)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    load_task: asyncio.Task[None] | None = None

    def fleet(self) -> dict[str, Any]:
        return http_json(self.url + "/v1/fleet")[1]

    def group(self) -> dict[str, Any]:
        (group,) = [g for g in self.fleet()["groups"] if g["name"] == "g0"]
        return group

    def answered_by(self, seed: int, after: float, before: float = float("inf")) -> int:
        """Requests sent in (after, before] (client clock) that the engine with `seed` answered."""
        tail = seed_fingerprint(seed)
        return sum(
            1 for s in self.out.sent if after < s.sent_at <= before and (s.fingerprint or "").endswith(tail)
        )

    async def serving(self, seeds: tuple[int, ...], after: float, what: str) -> None:
        await wait_until(lambda: all(self.answered_by(s, after) > 0 for s in seeds), 30, what)

    async def end_load(self) -> Outcomes:
        self.stop.set()
        assert self.load_task is not None
        await asyncio.wait_for(self.load_task, 60)
        out = self.out
        assert out.completed > 0 and len(out.sent) < LOAD_MAX_REQUESTS, (out.completed, len(out.sent))
        return out


def acked_removal(sup: Supervised, after: float) -> dict[str, Any]:
    """The router's acknowledgement of `sup`'s first fall from READY after `after` (supervisor clock):
    the FAILED transition's epoch, and the ack record of it."""
    records = sup.oplog()
    fall = min(
        (r for r in records if r["record"] == "transition" and r["time"] > after and r["state"] != "READY"),
        key=lambda r: r["epoch"],
    )
    (ack,) = [r for r in records if r["record"] == "ack" and r["epoch"] == fall["epoch"]]
    assert ack["router_id"] == ROUTER_ID, ack
    return {"fall": fall, "ack": ack}


def next_ready(sup: Supervised, after: float) -> dict[str, Any]:
    return min(
        (r for r in sup.transitions() if r["state"] == "READY" and r["time"] > after), key=lambda r: r["time"]
    )


async def bounded_load(router_url: str, out: Outcomes, stop: asyncio.Event) -> None:
    deadline = time.monotonic() + LOAD_MAX_SECONDS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def worker() -> None:
            while not stop.is_set() and len(out.sent) < LOAD_MAX_REQUESTS and time.monotonic() < deadline:
                await one_stream(session, router_url, out)

        await asyncio.gather(*(worker() for _ in range(LOAD_WORKERS)))


@contextlib.asynccontextmanager
async def group_fleet(tmp_path: Path, member_sim_args: tuple[str, ...] = ()) -> AsyncIterator[GroupFleet]:
    """Start the three supervised engines and the router, wait until the group is whole and every
    engine routable, start the samplers and the load, and yield once all three engines answered."""
    sups: list[Supervised] = []
    router: CorralProcess | None = None
    fleet: GroupFleet | None = None
    samplers: dict[str, AdmissionSampler] = {}
    try:
        for seed in range(3):
            extra = member_sim_args if seed < 2 else ()
            sups.append(
                start_supervised(sim_args=(*SIM_ARGS, "--seed", str(seed), *extra), sup_args=SUP_ARGS)
            )
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 60)
        backends = tmp_path / "backends"
        lines = [f"{s.engine_url}={s.url} group=g0/2" for s in sups[:2]] + [
            f"{sups[2].engine_url}={sups[2].url}"
        ]
        backends.write_text("\n".join(lines) + "\n")
        port = free_port()
        router = CorralProcess(
            [
                *("router", "--host", "127.0.0.1", "--port", str(port), "--router-id", ROUTER_ID),
                *(
                    "--supervisor-heartbeat",
                    "0.5",
                    "--policy",
                    "round_robin",
                    "--backends-file",
                    str(backends),
                ),
            ]
        )
        url = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(router.wait_http, url + "/health")
        fleet = GroupFleet(sups[:2], sups[2], router, url, samplers)
        await wait_until(
            lambda: sum(e["routable"] for e in fleet.fleet()["endpoints"]) == 3, 30, "all three routable"
        )
        for sup in sups:
            await wait_until(lambda s=sup: ROUTER_ID in s.state()["routers"]["subscribed"], 10, "subscribed")
            samplers[sup.engine_url] = AdmissionSampler(sup.engine_url)
            samplers[sup.engine_url].start()
        fleet.load_task = asyncio.create_task(bounded_load(url, fleet.out, fleet.stop))
        await fleet.serving((0, 1, 2), 0.0, "all three engines answering load")
        yield fleet
    finally:
        if fleet is not None and fleet.load_task is not None and not fleet.load_task.done():
            fleet.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(fleet.load_task, 60)
        for sampler in samplers.values():
            sampler.halt.set()
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
