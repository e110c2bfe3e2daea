"""Supervisor state streams: for every endpoint that has a supervisor, one task follows its
`GET /v1/state/watch?router_id=…` stream, applies each state to membership the moment the line is
read, and acknowledges each removal back to the supervisor (`POST /v1/acks`), and each return to READY
within a stream once the endpoint is back in its routing table (a wake's POSTCHECK waits for that).

The order is the contract: the endpoint leaves the routing table (synchronously, in `_apply`), then
the acknowledgement waits until every request already picked for that engine has been answered by it
(its upstream call returned: the engine has the request) or `dispatch_wait` passed, then, for a prefill
engine, until every decode leg this router started from its KV transfers has reached its decode engine
(`transfers_pending`) or `transfer_wait` passed, and only then is sent. A drain that has every
subscribed router's acknowledgement therefore knows no router will send the engine anything new.

A lost stream is treated as "not confirmed": the endpoint leaves routing at once (it keeps the last
state the supervisor gave, never READY) and the task reconnects with backoff; on reconnect the first
line is the supervisor's current state. A stream that is open but silent for `missed_heartbeats`
heartbeat intervals counts as stale and is handled the same way (closed, reconnected). This is what
lets a supervisor count a router whose stream closed as gone rather than wait for it. A line longer
than `state_line_bounds.MAX_LINE_BYTES`, or a state or operation line with a field past its bound, is
handled the same way too: counted, the stream closed (the endpoint out of routing) and reconnected.

Each subscription has its own task, every network call has a timeout, and acknowledgements run in
tasks of their own, so a slow or dead supervisor delays nothing but its own endpoint.

Every call carries the token of the supervisor it goes to (`StreamSettings.token_for`): one token
for all of them (`--supervisor-token-file`), or each pod's own, derived from the fleet key and the
pod's name (`--supervisor-token-key-file`, `corral.supervisor_tokens`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from corral.contracts.supervisor import (
    AckRequest,
    NotJSON,
    OperationInFlight,
    OperationLine,
    StateLine,
    UnusableLine,
    decode_watch_line,
)
from corral.engine_state import EngineState
from corral.router.discovery.state_line_bounds import (
    MAX_LINE_BYTES,
    StateLineRefused,
    check_operation,
    check_state_line,
)
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.membership import Membership
from corral.router.telemetry.engine_input import STATE_LINE
from corral.router.telemetry.metrics import RouterMetrics
from corral.supervisor_tokens import endpoint_pod_token

log = logging.getLogger("corral.router.supervisor_stream")

SOURCE = "supervisor"
LINE_LIMIT = MAX_LINE_BYTES  # a state event carries evidence (a drain report): allow long lines


# The management token of an endpoint's supervisor (None: send none).
TokenFor = Callable[[Endpoint], str | None]


def default_router_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def per_pod_tokens(key: bytes) -> TokenFor:
    """Each pod's own token, derived from the fleet key and the endpoint's pod ("namespace/name")."""
    return lambda endpoint: endpoint_pod_token(key, endpoint.name)


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True, slots=True)
class StreamSettings:
    router_id: str
    token: str | None = None  # one token for every supervisor
    tokens: TokenFor | None = None  # or each endpoint's own (wins over `token`)
    heartbeat_seconds: float = 2.0  # asked of the supervisor with each subscription
    missed_heartbeats: int = 3  # silent this many intervals: stale
    connect_timeout: float = 2.0
    ack_timeout: float = 2.0
    ack_attempts: int = 3
    dispatch_wait: float = 2.0
    transfer_wait: float = 5.0  # decode legs from a removed prefill engine's transfers, after dispatch
    backoff_initial: float = 0.1
    backoff_cap: float = 5.0

    @property
    def stale_after(self) -> float:
        return self.heartbeat_seconds * self.missed_heartbeats

    def token_for(self, endpoint: Endpoint) -> str | None:
        return self.tokens(endpoint) if self.tokens is not None else self.token


class StreamBroken(Exception):
    """The stream ended, answered something other than a stream, or fell silent."""

    def __init__(self, link: str, why: str) -> None:
        super().__init__(why)
        self.link = link
        self.why = why


class SupervisorStreams:
    def __init__(self, membership: Membership, metrics: RouterMetrics, settings: StreamSettings) -> None:
        self._membership = membership
        self._metrics = metrics
        self.settings = settings
        self._wanted: dict[str, Endpoint] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._acks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        membership.supervisors = self

    # -- SupervisorWatch: membership hands endpoints in and takes them back ---------------------

    def watch(self, endpoint: Endpoint) -> None:
        self._wanted[endpoint.url] = endpoint
        if self._session is not None and endpoint.url not in self._tasks:
            self._spawn(endpoint)

    def unwatch(self, url: str) -> None:
        self._wanted.pop(url, None)
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()

    def _spawn(self, endpoint: Endpoint) -> None:
        task = asyncio.create_task(self._follow(endpoint), name=f"corral-router-supervisor-{endpoint.url}")
        self._tasks[endpoint.url] = task

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            read_bufsize=LINE_LIMIT,
        )
        for endpoint in self._wanted.values():
            if endpoint.url not in self._tasks:
                self._spawn(endpoint)

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *self._acks]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- one subscription -------------------------------------------------------------------------

    async def _follow(self, endpoint: Endpoint) -> None:
        view = endpoint.supervisor
        assert view is not None
        backoff = self.settings.backoff_initial
        while True:
            heard_before = view.last_heard
            try:
                await self._read_stream(endpoint, view)
                raise StreamBroken("lost", "closed by the supervisor")
            except StreamBroken as exc:
                self._lost(endpoint, view, exc.link, exc.why)
            except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
                self._lost(endpoint, view, "lost", f"{type(exc).__name__}: {exc}".rstrip(": "))
            except Exception as exc:  # a bug here must not leave the endpoint routable on a dead task
                log.exception("following supervisor %s of %s failed", view.url, endpoint.url)
                self._lost(endpoint, view, "lost", f"{type(exc).__name__}: {exc}")
            if view.last_heard != heard_before:
                backoff = self.settings.backoff_initial  # it was up: try again soon, then back off
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.backoff_cap)

    async def _read_stream(self, endpoint: Endpoint, view: SupervisorView) -> None:
        assert self._session is not None
        s = self.settings
        params = {"router_id": s.router_id, "heartbeat": f"{s.heartbeat_seconds:g}"}
        timeout = aiohttp.ClientTimeout(total=None, connect=s.connect_timeout, sock_connect=s.connect_timeout)
        headers = bearer(s.token_for(endpoint))
        async with self._session.get(
            view.url + "/v1/state/watch", params=params, timeout=timeout, headers=headers
        ) as resp:
            if resp.status != 200:
                body = (await resp.read())[:200].decode(errors="replace")
                raise StreamBroken("lost", f"HTTP {resp.status}: {body}")
            first = True
            while True:
                try:
                    async with asyncio.timeout(s.stale_after):
                        raw = await resp.content.readline(max_line_length=LINE_LIMIT)
                except LineTooLong:
                    self._metrics.engine_input.count(STATE_LINE, "line_too_long")
                    raise StreamBroken("lost", f"a line longer than {LINE_LIMIT} bytes") from None
                except TimeoutError:
                    raise StreamBroken(
                        "stale", f"no line for {s.stale_after:g}s ({s.missed_heartbeats} heartbeats missed)"
                    ) from None
                if not raw:
                    return
                received = time.monotonic()
                view.last_heard = received
                try:
                    line = decode_watch_line(raw)
                except NotJSON as exc:
                    raise StreamBroken("lost", str(exc)) from None
                except UnusableLine as exc:
                    if isinstance(exc.line, dict) and exc.line.get("type") == "state":
                        log.warning("supervisor %s sent an unusable state line: %r", view.url, exc.line)
                        first = False
                    continue
                try:
                    if isinstance(line, StateLine):
                        check_state_line(line)
                    elif isinstance(line, OperationLine):
                        check_operation(line.operation)
                except StateLineRefused as exc:
                    self._metrics.engine_input.count(STATE_LINE, "out_of_bounds")
                    raise StreamBroken("lost", f"state line refused: {exc}") from None
                if isinstance(line, StateLine):
                    self._operation(endpoint, view, line.operation)
                    self._apply(endpoint, view, line, received, first)
                    first = False
                elif isinstance(line, OperationLine):  # a runbook step began: shown, never routed on
                    self._operation(endpoint, view, line.operation)
                # a heartbeat (or a line of a kind this version does not know): nothing to apply

    def _operation(self, endpoint: Endpoint, view: SupervisorView, said: OperationInFlight | None) -> None:
        """The operation in flight as the stream says it now; a step begun or an end is kept for the
        dashboard's recent events."""
        self._membership.operation_steps.heard(endpoint.url, endpoint.name, view.operation, said)
        view.operation = said

    def _apply(
        self, endpoint: Endpoint, view: SupervisorView, line: StateLine, received: float, first: bool
    ) -> None:
        """One state line: into membership now; a removal is acknowledged once it holds."""
        epoch, state = line.epoch, line.state
        if not first and view.epoch is not None and epoch <= view.epoch:
            return  # epochs only grow within one stream
        was_removed = view.state is not EngineState.READY or view.link != "connected"
        view.link, view.link_reason = "connected", "state stream open"
        view.state = state
        view.sub_state = line.sub_state
        view.reason = line.reason
        view.epoch = epoch
        view.event_time = line.time
        view.fingerprint = line.fingerprint
        view.bundle_name = line.bundle_name
        view.prefix_epoch = line.prefix_epoch  # a change makes routing forget the engine's prefixes
        self._learn_role(endpoint, view, line)
        self._metrics.count_event(SOURCE, "STATE")
        was_routable = endpoint.in_routing
        # The group as it stands before this line: an acknowledgement covers every member of it.
        group = self._membership.group_members(endpoint)
        self._membership.supervisor_changed(endpoint.url, cause=f"supervisor_{state.value.lower()}")
        if state is EngineState.READY:
            self._apply_withdrawn(endpoint, view, line, epoch, received)
            if was_removed and not first and endpoint.in_routing:
                self._readded(endpoint, view, epoch)
            return
        removal_latency = time.monotonic() - received
        if was_routable:
            self._metrics.supervisor_removal_latency.observe(removal_latency)
        # Acknowledge the first non-READY epoch of a stream and each later fall from READY: the one
        # a drain waits for (its removal epoch, or a later one for a router that joined mid-drain).
        if first or not was_removed:
            task = asyncio.create_task(
                self._acknowledge(endpoint, view, epoch, state, removal_latency, group),
                name=f"corral-router-ack-{endpoint.url}-{epoch}",
            )
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)

    def _learn_role(self, endpoint: Endpoint, view: SupervisorView, line: StateLine) -> None:
        """The role and pairing identity the line says (kept when it says none: an older supervisor);
        a role other than the declared one is logged once per change (the supervisor's wins)."""
        role, pairing = line.role or view.role, line.pairing or view.pairing
        if role != view.role:
            view.role = role
            self._membership.note_role(role)
            mismatch = endpoint.role_mismatch()
            if mismatch is not None:
                log.warning("endpoint %s: %s", endpoint.url, mismatch)
            else:
                log.info("endpoint %s: role %s (its supervisor says)", endpoint.url, role)
        view.pairing = pairing
        view.connector = line.connector or view.connector
        view.kv_events = line.kv_events or view.kv_events

    def _apply_withdrawn(
        self, endpoint: Endpoint, view: SupervisorView, line: StateLine, epoch: int, received: float
    ) -> None:
        """A READY line names the models withdrawn from routing here (none when it does not say): a
        LoRA adapter about to be unloaded. A new withdrawal is acknowledged like a removal."""
        withdrawn = line.withdrawn_adapters
        newly = withdrawn - endpoint.withdrawn_models
        self._membership.withdraw_models(endpoint.url, withdrawn)
        if newly:
            task = asyncio.create_task(
                self._acknowledge(endpoint, view, epoch, EngineState.READY, time.monotonic() - received),
                name=f"corral-router-ack-{endpoint.url}-{epoch}",
            )
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)

    def _readded(self, endpoint: Endpoint, view: SupervisorView, epoch: int) -> None:
        """READY again after a removal this stream saw (a wake, a recovered operation, a restart), and
        the endpoint in the routing table again: acknowledged at once (nothing to wait for), so the
        supervisor knows this router routes to it again. A stream's first line is not acknowledged: the
        supervisor counts a router that subscribed after the return as having read READY."""
        body = AckRequest(router_id=self.settings.router_id, epoch=epoch, state=EngineState.READY).encode()
        task = asyncio.create_task(
            self._send_ack(endpoint, view, epoch, body), name=f"corral-router-ack-{endpoint.url}-{epoch}"
        )
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    def _lost(self, endpoint: Endpoint, view: SupervisorView, link: str, why: str) -> None:
        if view.link != link or view.link_reason != why:
            log.warning("supervisor %s of %s: stream %s (%s)", view.url, endpoint.url, link, why)
        if view.link == "connected":
            self._metrics.count_event(SOURCE, link.upper())
        view.link, view.link_reason = link, why
        self._membership.supervisor_changed(endpoint.url, cause=f"supervisor_stream_{link}")

    # -- acknowledgements -------------------------------------------------------------------------

    async def _acknowledge(
        self,
        endpoint: Endpoint,
        view: SupervisorView,
        epoch: int,
        state: EngineState,
        removal_latency: float,
        group: list[Endpoint] | None = None,
    ) -> None:
        s = self.settings
        members = group or [endpoint]
        await _dispatched(members, s.dispatch_wait)
        undispatched = sum(m.dispatching for m in members)
        await _transfers_reached(members, s.transfer_wait)
        unconfirmed = sum(m.transfers_pending for m in members)
        body = AckRequest(
            router_id=s.router_id,
            epoch=epoch,
            state=state,
            removal_latency_s=removal_latency,
            undispatched=undispatched,
            transfers_unconfirmed=unconfirmed,
        ).encode()
        if unconfirmed:
            log.warning(
                "acknowledging epoch %d of %s with %d decode legs from its KV transfers not yet at their "
                "decode engine after %gs (those transfers are pulled late or time out on the engine)",
                epoch,
                endpoint.url,
                unconfirmed,
                s.transfer_wait,
            )
        if undispatched:
            log.warning(
                "acknowledging epoch %d of %s with %d requests (to it or its serving group) not yet "
                "answered after %gs",
                epoch,
                endpoint.url,
                undispatched,
                s.dispatch_wait,
            )
        await self._send_ack(endpoint, view, epoch, body)

    async def _send_ack(self, endpoint: Endpoint, view: SupervisorView, epoch: int, body: bytes) -> None:
        s = self.settings
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=s.ack_timeout)
        # the supervisor refuses a mutating call that is not JSON
        headers = {"Content-Type": "application/json", **bearer(s.token_for(endpoint))}
        why = ""
        for attempt in range(s.ack_attempts):
            if attempt:
                await asyncio.sleep(0.1 * 3 ** (attempt - 1))
            try:
                async with self._session.post(
                    view.url + "/v1/acks",
                    data=body,
                    headers=headers,
                    timeout=timeout,
                ) as resp:
                    answer = await resp.read()
                    if resp.status == 200:
                        view.acked_epoch = max(epoch, view.acked_epoch or 0)
                        view.acks_sent += 1
                        self._metrics.count_ack("sent")
                        return
                    why = f"HTTP {resp.status}: {answer[:200].decode(errors='replace')}"
                    if 400 <= resp.status < 500:
                        break
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}"
        self._metrics.count_ack("failed")
        log.warning("acknowledgement of epoch %d to %s failed: %s", epoch, view.url, why)


async def _dispatched(endpoints: list[Endpoint], within: float) -> None:
    """Return once every request picked for any of `endpoints` (the one removed, and the rest of its
    serving group) has had its answer start (so the engine has it), or after `within` seconds.
    Polls: the data path keeps no waiters, only a counter."""
    deadline = time.monotonic() + within
    while True:
        if all(e.dispatching <= 0 for e in endpoints) or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.002)


async def _transfers_reached(endpoints: list[Endpoint], within: float) -> None:
    """Return once no decode leg this router started from the KV transfers of any of `endpoints` (a
    prefill engine) is still before its first byte, or after `within` seconds. Polls, like `_dispatched`."""
    deadline = time.monotonic() + within
    while True:
        if all(e.transfers_pending <= 0 for e in endpoints) or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.002)
