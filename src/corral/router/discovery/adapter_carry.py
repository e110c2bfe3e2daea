"""A joining engine gets the LoRA adapters its fleet loaded at run time before it takes traffic
(`corral router --carry-adapters`; `corral k8s render` sets it).

Why the router: in Kubernetes a pod that joins later (a scale-up, a pod replaced) starts with its
`--lora` set (`corral.yaml`'s `engine.lora`) and an empty state dir, so it knows nothing of the
adapters `corral lora load` put on the other pods. Its supervisor cannot ask them: each pod's token
opens only its own supervisor. The router follows every supervisor of the fleet, holds the fleet key
that derives each pod's token, and decides what is routable: the one place that can see the fleet's
desired set and keep a pod out of routing until it serves it.

What it does, for each endpoint with a supervisor that membership adds (`Membership.admit`):
1. hold it out of routing (`Endpoint.held`, named in `/v1/fleet`'s `why`);
2. once its supervisor says READY, read the desired set (`adapters.desired`: `--lora` and runtime
   loads) of every READY supervisor the router follows and routes (not held), and take their union
   (`fleet_adapter_set`; one name wanted from two paths is a conflict, named); the union is read once
   for the endpoints joining together and kept `retry_seconds`;
3. load each adapter of the union its own supervisor does not desire yet through that supervisor
   (`POST /v1/lora/load`: the runbook operation, VERIFY included, and the adapter joins the pod's
   runtime set), the operation id the same for every router replica and worker, so they join one
   operation instead of racing;
4. release it into routing.

A step that fails keeps it held and is tried again every `retry_seconds`; after `hold_seconds` the
endpoint is released anyway, serving what it has (requests for an adapter it lacks still go only to
engines that list it), and the failure stays in `/v1/fleet` and the log. An endpoint that leaves is
forgotten. A router that restarts sees every endpoint join again: all are held, so none is a peer and
each is released after reading its own state (nothing is carried then: a pod that joined while no
router ran gets the fleet's adapters only from `corral rollout` or `corral lora load`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from corral.aio import cancel_tasks
from corral.clients.calls import APIError
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.contracts.fleet_adapters import AdapterConflict, fleet_adapter_set
from corral.contracts.operations import LoadAdapterRequest
from corral.contracts.supervisor import SupervisorState
from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership

log = logging.getLogger("corral.router.adapter_carry")

JOINING = "joining: the fleet's runtime LoRA adapters are not carried here yet"
LOAD_SECONDS = 120.0  # one adapter's load operation on one supervisor
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

TokenFor = Callable[[Endpoint], "str | None"]


@dataclass(frozen=True)
class CarrySettings:
    hold_seconds: float = 120.0  # the longest a joining endpoint is held
    retry_seconds: float = 2.0  # between tries of a carry that failed
    poll_seconds: float = 0.2  # how often held endpoints are looked at


class CarryFailed(RuntimeError):
    """The fleet's adapters could not be carried to an endpoint; the message says which and why."""


@dataclass
class Joining:
    """An endpoint held while it joins: since when, since when its supervisor is READY, its last failure."""

    endpoint: Endpoint
    since: float = field(default_factory=time.monotonic)
    ready_since: float | None = None  # the hold's clock starts here: before, it is not routable anyway
    next_try: float = 0.0
    failure: str | None = None
    task: asyncio.Task[None] | None = None


def operation_id(adapter: str, engine_pid: int | None) -> str:
    """One id per adapter and engine life, the same in every router: replicas join one operation."""
    return _UNSAFE.sub("-", f"join-lora-{adapter}-{engine_pid or 0}")[:120]


class AdapterCarry:
    def __init__(self, membership: Membership, token_for: TokenFor, settings: CarrySettings) -> None:
        self._membership = membership
        self._token_for = token_for
        self.settings = settings
        self._joining: dict[str, Joining] = {}
        self._session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.carried: dict[str, dict[str, str]] = {}  # url -> what was loaded there (this router's word)
        # the last read of the fleet's desired sets: when it was read, over which peers, and its union
        self._wanted: tuple[float, tuple[str, ...], dict[str, str] | None] = (0.0, (), None)
        self._wanted_lock = asyncio.Lock()
        membership.admit = self.admit

    def admit(self, endpoint: Endpoint) -> str | None:
        """Membership's hook: every endpoint followed through a supervisor joins held."""
        if endpoint.supervisor is None:
            return None
        self._joining[endpoint.url] = Joining(endpoint)
        return JOINING

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LOAD_SECONDS + 30))
        self._loop_task = asyncio.create_task(self._loop(), name="corral-router-adapter-carry")

    async def stop(self) -> None:
        tasks = [j.task for j in self._joining.values() if j.task is not None]
        if self._loop_task is not None:
            tasks.append(self._loop_task)
        await cancel_tasks(*tasks)
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            self.tick(time.monotonic())
            await asyncio.sleep(self.settings.poll_seconds)

    def tick(self, now: float) -> None:
        """Start the carries that are due; release the endpoints held too long; forget those gone."""
        for url, joining in list(self._joining.items()):
            endpoint = joining.endpoint
            if self._membership.get(url) is not endpoint:  # it left membership
                if joining.task is not None:
                    joining.task.cancel()
                del self._joining[url]
                continue
            if joining.task is not None and not joining.task.done():
                continue
            view = endpoint.supervisor
            ready = view is not None and view.link == "connected" and view.state is EngineState.READY
            if ready and joining.ready_since is None:
                joining.ready_since = now
            if joining.ready_since is not None and now - joining.ready_since > self.settings.hold_seconds:
                self._give_up(joining)
                continue
            if ready and now >= joining.next_try:
                joining.task = asyncio.create_task(self._attempt(joining), name=f"corral-carry-{url}")

    def _give_up(self, joining: Joining) -> None:
        url = joining.endpoint.url
        del self._joining[url]
        why = joining.failure or "no carry finished"
        log.warning(
            "endpoint %s released after %.0f s without the fleet's adapters: %s",
            url,
            self.settings.hold_seconds,
            why,
        )
        self._membership.release(url, f"adapters not carried within {self.settings.hold_seconds:g}s: {why}")

    async def _attempt(self, joining: Joining) -> None:
        url = joining.endpoint.url
        try:
            loaded = await self.carry(joining.endpoint, joining.ready_since or 0.0)
        except Exception as exc:  # CarryFailed, APIError, a connection error; any other is logged too
            joining.failure = str(exc)
            joining.next_try = time.monotonic() + self.settings.retry_seconds
            self._membership.hold(url, f"{JOINING}: {exc}")
            log.warning("endpoint %s: adapters not carried yet: %s", url, exc)
            return
        self._joining.pop(url, None)
        self.carried[url] = loaded
        what = f"loaded {sorted(loaded)}" if loaded else "the fleet's adapters were already there"
        self._membership.release(url, f"joined: {what}")

    def _client(self, endpoint: Endpoint) -> SupervisorClient:
        assert self._session is not None and endpoint.supervisor is not None
        return SupervisorClient(self._session, endpoint.supervisor.url, self._token_for(endpoint))

    async def _fleet_wanted(self, not_before: float) -> dict[str, str]:
        """The union of the desired sets of the READY supervisors not held (the fleet as it routes
        now), read once for all the endpoints joining together and kept `retry_seconds`: K pods
        joining an N-pod fleet cost N reads, not K x N. A read is reused only over the same peers and
        only if it began at or after `not_before` (when the joining endpoint became READY): a read
        taken before a peer was released, or before an adapter was loaded on a peer while this endpoint
        started, would carry the fleet as it was (a pod joining right after another was released with
        nothing, and an adapter loaded on that one in between, was not carried)."""
        async with self._wanted_lock:
            peers = [
                e
                for e in self._membership.endpoints()
                if e.held is None
                and e.supervisor is not None
                and e.supervisor.link == "connected"
                and e.supervisor.state is EngineState.READY
            ]
            over = tuple(sorted(e.url for e in peers))
            read_at, read_over, wanted = self._wanted
            if (
                wanted is not None
                and read_over == over
                and read_at >= not_before
                and time.monotonic() - read_at < self.settings.retry_seconds
            ):
                return wanted
            started = time.monotonic()

            async def one(peer: Endpoint) -> tuple[str, SupervisorState]:
                try:
                    return peer.name or peer.url, await self._client(peer).state()
                except APIError as exc:
                    raise CarryFailed(f"the adapters of {peer.name or peer.url} are unknown: {exc}") from None

            try:
                wanted = fleet_adapter_set(await asyncio.gather(*(one(p) for p in peers)))
            except AdapterConflict as exc:
                raise CarryFailed(str(exc)) from None
            self._wanted = (started, over, wanted)
            return wanted

    async def carry(self, endpoint: Endpoint, not_before: float = 0.0) -> dict[str, str]:
        """Load on `endpoint` the adapters its peers desire and it does not; what it loaded. The
        fleet's sets are read at or after `not_before` (when `endpoint` became READY)."""
        wanted = await self._fleet_wanted(not_before)
        client = self._client(endpoint)
        own = await client.state()
        missing = {name: path for name, path in wanted.items() if name not in own.adapters.desired}
        for name, path in missing.items():
            request = LoadAdapterRequest(
                name=name, path=path, operation_id=operation_id(name, own.engine.pid)
            )
            try:
                record = await client.run(request, within=LOAD_SECONDS)
            except OperationStillRunning:
                raise CarryFailed(
                    f"adapter {name!r} ({path}) still loading after {LOAD_SECONDS:g}s"
                ) from None
            if not record.succeeded:
                raise CarryFailed(f"adapter {name!r} ({path}) could not be loaded: {record.error}")
        if missing:
            served = set((await client.state()).adapters.served)
            lacking = sorted(set(missing) - served)
            if lacking:
                raise CarryFailed(f"adapters {lacking} loaded but not in the supervisor's served list")
        return missing

    def to_json(self) -> dict[str, object]:
        """What `/v1/fleet` shows: the endpoints held now, and what was carried where."""
        now = time.monotonic()
        return {
            "joining": {
                url: {"seconds": round(now - j.since, 3), "failure": j.failure}
                for url, j in self._joining.items()
            },
            "carried": {url: dict(sorted(loaded.items())) for url, loaded in self.carried.items()},
        }
