"""Idle sleep (`corral supervise --sleep-after-seconds N`): a READY engine that has served no request
for N seconds is put to sleep through the runbook's sleep (`runbook/sleep.py`, every check of it),
as operation `idle-sleep-<epoch>`, with the reason ("idle 300 s") in the change record, the oplog's
`idle_sleep` record and `/v1/state`'s `sleep.reason`; a router's wake on demand brings it back.

Traffic is what the engine itself counts (the stall watch's `/metrics` reading every 0.5 s): requests
running or waiting, or a change of the requests it finished other than the supervisor's own smoke
requests; and requests open at the admission gate. The clock starts again at every READY.

The last awake engine of a model is not put to sleep unless `--sleep-last-awake`: a supervisor knows
no fleet, so it asks the supervisors it is told of (`--sleep-peer URL`, with its own management
token) for their `/v1/state`. It sleeps only when a peer serving the same model is READY and stays
awake: one not idle itself, or idle but first by engine URL (of the idle engines, the first stays
awake, the others sleep). Without peers it is the last awake engine as far as it knows. The window in
which two peers each see the other awake is one read of `/v1/state` (a peer's idle sleep leaves READY
at its first step); wake on demand covers what that window lets through.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from corral.engine.load_sample import LoadSample
from corral.engine_state import EngineState
from corral.supervisor.lifecycle.idle_settings import IdleSleepSettings
from corral.supervisor.runbook.run import start_operation
from corral.supervisor.runbook.sleep import SleepPlan
from corral.supervisor.runbook.template import Refused

if TYPE_CHECKING:
    from corral.supervisor.lifecycle.supervisor import EngineSupervisor

PEER_STATE_BYTES = 4 * 1024 * 1024  # a peer's /v1/state answer read at most
PEER_SECONDS = 2.0  # each peer read's time limit
PEER_EVERY = 5.0  # the peers asked at most this often while held awake
REFUSED_BACKOFF_MAX = 3600.0  # a refused idle sleep is tried again after N s, doubling up to this


class IdleClock:
    """When the engine last had traffic, fed its load readings: requests running or waiting, or more
    requests finished than ever before beyond `own` (the supervisor's own smoke requests).

    `own` and the engine's counter move at different moments: the stall watch counts a smoke when its
    answer comes, before its next reading of the engine's `/metrics`, which shows it then or a reading
    later. So a smoke makes the finished-beyond-own figure dip for a reading or two and come back, never
    rise past its highest; only a request of someone else's does. (Reading any change as traffic
    restarted the clock at every idle smoke whose count the engine showed late, as on a loaded machine.)"""

    def __init__(self, now: float) -> None:
        self.idle_since = now
        self._served: float | None = None

    def restart(self, now: float) -> None:
        self.idle_since = now
        self._served = None

    def observe(self, sample: LoadSample, own: int, open_at_gate: int, now: float) -> None:
        served = sample.finished - own
        more = self._served is None or served > self._served
        if sample.in_flight > 0 or open_at_gate > 0 or (more and self._served is not None):
            self.idle_since = now
        if more:
            self._served = served  # the highest: a dip (a smoke counted on one side first) is no traffic


class IdleSleep:
    def __init__(self, sup: EngineSupervisor, settings: IdleSleepSettings) -> None:
        self._sup = sup
        self.settings = settings
        self.clock = IdleClock(time.monotonic())
        self.held_awake: str | None = None  # why an idle engine stays awake (the last-awake rule)
        self.last: dict[str, Any] | None = None  # the last idle sleep asked: op id, when, outcome
        self._asked_peers = 0.0
        self._refusals = 0  # refused idle sleeps in a row: each waits twice as long for the next try
        self._not_before = 0.0

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        idle_for = time.monotonic() - self.clock.idle_since
        return {
            "after_seconds": s.after_seconds,
            "level": s.level,
            "mode": s.mode,
            "peers": list(s.peers),
            "last_awake": s.last_awake,
            "idle_for_s": round(idle_for, 1) if self._sup.machine.state is EngineState.READY else None,
            "idle": self._sup.machine.state is EngineState.READY and idle_for >= s.after_seconds,
            "held_awake": self.held_awake,
            "last": self.last,
        }

    async def run(self) -> None:
        tick = min(1.0, self.settings.after_seconds / 4)
        watched: object = None
        while True:
            await asyncio.sleep(tick)
            sup, now = self._sup, time.monotonic()
            watch = sup.stall_watch
            if sup.machine.state is not EngineState.READY or sup.busy is not None or watch is None:
                self.clock.restart(now)
                self.held_awake = None
                continue
            if watch is not watched:  # a new READY: a new engine or a new serve, a new count
                watched = watch
                self.clock.restart(now)
            sample = watch.last_sample
            if sample is None:
                continue
            gate = sup.gate
            self.clock.observe(sample, watch.smokes, sum(gate.in_flight.values()) if gate else 0, now)
            if now - self.clock.idle_since < self.settings.after_seconds:
                self.held_awake = None
                continue
            if now < self._not_before:  # the last idle sleep was refused: its back-off
                continue
            if now - self._asked_peers < PEER_EVERY and self.held_awake is not None:
                continue
            self._asked_peers = now
            held = await self._why_stay_awake()
            if held is not None:
                if held != self.held_awake:
                    sup.log(f"idle for {now - self.clock.idle_since:.0f} s but staying awake: {held}")
                    sup.oplog.append("idle_sleep_held", reason=self.settings.reason, held_awake=held)
                self.held_awake = held
                continue
            self.held_awake = None
            await self._sleep(now)

    async def _sleep(self, now: float) -> None:
        sup, s = self._sup, self.settings
        op_id = f"idle-sleep-{sup.machine.epoch}"
        idle_for = round(now - self.clock.idle_since, 1)
        sup.log(f"{s.reason}: putting the engine to sleep (level {s.level}, mode {s.mode}) as {op_id}")
        sup.oplog.append(
            "idle_sleep", operation_id=op_id, reason=s.reason, idle_for_s=idle_for, level=s.level
        )
        try:
            await start_operation(
                sup,
                SleepPlan(sup, s.level, s.mode, reason=s.reason),
                op_id,
                None,
                f"level {s.level}, {s.reason}",
            )
        except Refused as exc:
            sup.log(f"idle sleep refused: {exc}")
            sup.oplog.append("idle_sleep_refused", operation_id=op_id, reason=s.reason, refused=str(exc))
            self._refusals += 1
            wait = min(REFUSED_BACKOFF_MAX, s.after_seconds * 2**self._refusals)
            self._not_before = now + wait
            self.held_awake = f"idle sleep refused ({exc}); next try in {wait:g} s"
            self.last = {"operation_id": op_id, "at": time.time(), "refused": str(exc)}
            return
        self._refusals = 0
        self.last = {"operation_id": op_id, "at": time.time(), "reason": s.reason}

    async def _why_stay_awake(self) -> str | None:
        """None when this engine may sleep; else why not, in words for the state and the oplog."""
        s, sup = self.settings, self._sup
        if s.last_awake:
            return None
        model = sup.served_model or sup.config.model or "its model"
        if not s.peers:
            return f"the last awake engine of {model} this supervisor knows (no --sleep-peer)"
        own = sup.config.engine_url
        token = sup.config.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        states = await asyncio.gather(*(_peer_state(sup.session, url, headers) for url in s.peers))
        unread = 0
        for peer in states:
            if peer is None:
                unread += 1
                continue
            state, peer_model, url, idle, busy = peer
            if state != EngineState.READY.value or peer_model != model or busy:
                continue
            if not idle or url < own:
                return None
        unread_text = f"; {unread} of {len(s.peers)} peers did not answer" if unread else ""
        return f"the last awake engine of {model} among its --sleep-peer supervisors{unread_text}"


PeerState = tuple[str, str | None, str, bool, bool]  # state, model, engine url, idle, busy


async def _peer_state(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> PeerState | None:
    """A peer's state, model, engine URL, whether it is idle past its own limit and whether an
    operation holds it; None when it does not answer 200 with a state body in time."""
    try:
        async with session.get(
            url.rstrip("/") + "/v1/state", headers=headers, timeout=aiohttp.ClientTimeout(total=PEER_SECONDS)
        ) as resp:
            if resp.status != 200:
                return None
            raw = await resp.content.read(PEER_STATE_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError):
        return None
    if len(raw) > PEER_STATE_BYTES:
        return None
    return read_peer_state(raw)


def read_peer_state(raw: bytes) -> PeerState | None:
    """The fields the last-awake rule reads from a peer's `/v1/state`; None for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    engine, idle_sleep = body.get("engine"), body.get("idle_sleep")
    state = body.get("state")
    if not isinstance(state, str) or not isinstance(engine, dict) or not isinstance(engine.get("url"), str):
        return None
    model = engine.get("model")
    idle = isinstance(idle_sleep, dict) and idle_sleep.get("idle") is True
    return state, model if isinstance(model, str) else None, engine["url"], idle, body.get("busy") is not None
