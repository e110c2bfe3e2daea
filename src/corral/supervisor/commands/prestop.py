"""`corral supervise prestop`: ask the supervisor to drain (one operation id, so a retried hook joins
the same drain) and block until the drain has finished, showing its progress."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import aiohttp

from corral.clients.calls import APIError
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.contracts.operations import DrainRequest

Print = Callable[[str], None]


async def run_prestop(url: str, token: str | None, policy: str | None, limit_s: float, say: Print) -> int:
    """0 when the drain finished (or there was no supervisor left to drain), 1 otherwise."""
    asked = {"policy": policy} if policy else {}
    request = DrainRequest(operation_id=f"prestop-{uuid.uuid4().hex[:12]}", **asked)
    async with aiohttp.ClientSession() as session:
        supervisor = SupervisorClient(session, url, token, timeout=10.0)
        try:
            record, _ = await supervisor.start(request)
        except APIError as exc:
            if exc.unreachable:
                say(f"supervisor at {url} is not answering ({exc.message}); nothing to drain")
                return 0
            say(f"drain refused with HTTP {exc.status}: {exc.message}")
            return 1
        say(f"drain {record.operation_id} started")
        try:
            record = await supervisor.wait_for_operation(
                record.operation_id, within=limit_s, on_poll=supervisor.progress_lines(say)
            )
        except OperationStillRunning:
            say(f"drain not finished after {limit_s:g}s")
            return 1
        except APIError as exc:
            if not exc.unreachable:
                raise
            say("supervisor went away while draining; the engine went with it")
            return 0
    if record.succeeded:
        say("drain finished")
        return 0
    say(f"drain failed: {record.error}")
    return 1
