"""`corral supervise prestop`: ask the supervisor to drain (one operation id, so a retried hook joins
the same drain) and block until the drain has finished, showing its progress."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

Print = Callable[[str], None]


async def run_prestop(url: str, token: str | None, policy: str | None, limit_s: float, say: Print) -> int:
    """0 when the drain finished (or there was no supervisor left to drain), 1 otherwise."""
    headers = {"content-type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body: dict[str, Any] = {"operation_id": f"prestop-{uuid.uuid4().hex[:12]}"}
    if policy:
        body["policy"] = policy
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.post(url + "/v1/drain", data=orjson.dumps(body)) as resp:
                answer = orjson.loads(await resp.read())
                if resp.status not in (200, 202):
                    say(f"drain refused with HTTP {resp.status}: {answer}")
                    return 1
        except aiohttp.ClientConnectionError as exc:
            say(f"supervisor at {url} is not answering ({exc}); nothing to drain")
            return 0
        op_id = str(answer["operation_id"])
        say(f"drain {op_id} started")
        last_state = ""
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{url}/v1/operations/{op_id}") as resp:
                    op = orjson.loads(await resp.read())
                async with session.get(url + "/v1/state") as resp:
                    state = orjson.loads(await resp.read())
            except aiohttp.ClientConnectionError:
                say("supervisor went away while draining; the engine went with it")
                return 0
            shown = f"{state.get('state')}/{state.get('sub_state')}: {state.get('reason')}"
            if shown != last_state:
                say(shown)
                last_state = shown
            if op.get("status") == "succeeded":
                say("drain finished")
                return 0
            if op.get("status") == "failed":
                say(f"drain failed: {op.get('error')}")
                return 1
            await asyncio.sleep(0.5)
    say(f"drain not finished after {limit_s:g}s")
    return 1
