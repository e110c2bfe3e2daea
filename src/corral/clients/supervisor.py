"""`SupervisorClient`: the supervisor's management API, typed: its state, its watch stream, starting
an operation and following it to its end with one poll interval and one deadline rule."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp

from corral.clients.calls import APIError, JSONCaller, server_message
from corral.contracts.operations import OperationRecord, OperationRequest
from corral.contracts.supervisor import (
    AckRecord,
    AckRequest,
    LeftoverReport,
    SupervisorState,
    UnusableLine,
    WatchLine,
    decode_watch_line,
)

POLL_SECONDS = 0.25  # how often an operation is asked about while it runs

Progress = Callable[[OperationRecord], Awaitable[None]]


class OperationStillRunning(APIError):
    """The deadline passed with the operation still running (it goes on on the supervisor)."""

    def __init__(self, where: str, record: OperationRecord, within: float) -> None:
        super().__init__(where, None, f"{record.kind} {record.operation_id} still running after {within:g}s")
        self.record = record


class SupervisorClient:
    def __init__(
        self, session: aiohttp.ClientSession, url: str, token: str | None = None, timeout: float = 10.0
    ) -> None:
        self._api = JSONCaller(session, url, token, "supervisor", timeout)
        self._session = session

    @property
    def url(self) -> str:
        return self._api.url

    def __repr__(self) -> str:
        return f"SupervisorClient({self.url})"

    async def state(self) -> SupervisorState:
        status, raw = await self._api.call("GET", "/v1/state")
        return self._api.parse(SupervisorState, "/v1/state", status, raw)

    async def leftovers(self) -> LeftoverReport:
        """What operations left behind on the supervisor's host, looked for now (`GET /v1/leftovers`)."""
        status, raw = await self._api.call("GET", "/v1/leftovers")
        return self._api.parse(LeftoverReport, "/v1/leftovers", status, raw)

    async def start(
        self, request: OperationRequest, idempotency_key: str | None = None
    ) -> tuple[OperationRecord, bool]:
        """Post an operation; (its record, True when this call started it, False when it joined a
        run of the same id). APIError with the supervisor's message when it refused (400, 409)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        status, raw = await self._api.call(
            "POST", request.route, request.body(), ok=(200, 202), headers=headers
        )
        return self._api.parse(OperationRecord, request.route, status, raw), status == 202

    async def operation(self, op_id: str) -> OperationRecord:
        path = f"/v1/operations/{op_id}"
        status, raw = await self._api.call("GET", path)
        return self._api.parse(OperationRecord, path, status, raw)

    async def wait_for_operation(
        self,
        op_id: str,
        *,
        within: float,
        poll: float = POLL_SECONDS,
        on_poll: Progress | None = None,
    ) -> OperationRecord:
        """The operation's record once it has ended (succeeded or failed: the caller decides what a
        failure means). Asked every `poll` seconds, `on_poll` called with each record read; when
        `within` seconds pass first, `OperationStillRunning`."""
        deadline = time.monotonic() + within
        while True:
            record = await self.operation(op_id)
            if on_poll is not None:
                await on_poll(record)
            if record.done:
                return record
            if time.monotonic() >= deadline:
                raise OperationStillRunning(self._api.where(f"/v1/operations/{op_id}"), record, within)
            await asyncio.sleep(poll)

    def progress_lines(self, say: Callable[[str], None]) -> Progress:
        """An `on_poll` that shows the supervisor's progress line (from `/v1/state`) each time it
        changes, so a person watching an operation sees every step it passes."""
        shown = ""

        async def show(_: OperationRecord) -> None:
            nonlocal shown
            line = (await self.state()).progress
            if line != shown:
                say(line)
                shown = line

        return show

    async def run(
        self,
        request: OperationRequest,
        *,
        within: float,
        poll: float = POLL_SECONDS,
        on_poll: Progress | None = None,
    ) -> OperationRecord:
        """Start (or join) an operation and wait for its end."""
        record, _ = await self.start(request)
        if record.done:
            return record
        return await self.wait_for_operation(record.operation_id, within=within, poll=poll, on_poll=on_poll)

    async def ack(self, ack: AckRequest, within: float | None = None) -> AckRecord:
        status, raw = await self._api.call("POST", "/v1/acks", ack.to_wire(), within=within)
        return self._api.parse(AckRecord, "/v1/acks", status, raw)

    async def watch(
        self,
        router_id: str | None = None,
        heartbeat: float | None = None,
        *,
        connect_timeout: float = 2.0,
        line_timeout: float | None = None,
        on_unusable: Callable[[UnusableLine], None] | None = None,
    ) -> AsyncIterator[WatchLine]:
        """The lines of `GET /v1/state/watch` as they come (the current state first) until the
        supervisor closes the stream; a line of a kind this version does not know is skipped.
        `line_timeout`: TimeoutError when no line came for that long. A line that is not JSON raises
        `NotJSON`; a state line without a usable epoch or state goes to `on_unusable` and is skipped
        (raised when there is none)."""
        params = {}
        if router_id is not None:
            params["router_id"] = router_id
        if heartbeat is not None:
            params["heartbeat"] = f"{heartbeat:g}"
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout)
        async with self._session.get(
            self.url + "/v1/state/watch", params=params, timeout=timeout, headers=self._api.headers
        ) as resp:
            if resp.status != 200:
                message = server_message((await resp.read())[:2000])
                raise APIError(self._api.where("/v1/state/watch"), resp.status, message)
            while True:
                async with asyncio.timeout(line_timeout):
                    raw = await resp.content.readline()
                if not raw:
                    return
                try:
                    line = decode_watch_line(raw)
                except UnusableLine as exc:
                    if on_unusable is None:
                        raise
                    on_unusable(exc)
                    continue
                if line is not None:
                    yield line
