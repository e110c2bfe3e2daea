"""One OpenAI chat completion sent to the router, and how it ended: ok, or the kind of its failure
(the HTTP status, a connection that failed or closed, a stream cut before `data: [DONE]` or ended by an
error event, an answer without choices, a timeout)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from corral.fleet.load.tally import RequestOutcome


def chat_body(model: str, number: int, streamed: bool, max_tokens: int) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {number}: say something about the sea."}],
        "max_tokens": max_tokens,
    }
    if streamed:
        body["stream"] = True
    return orjson.dumps(body)


HEAD = 32  # bytes of a line kept: enough to tell `data: [DONE]` and an error event from the rest


async def _streamed_failure(resp: aiohttp.ClientResponse) -> str | None:
    """How a 200's event stream ended: None after `data: [DONE]`, else why not. Lines are read in
    chunks, keeping only each one's start, so a line of any length is read in constant memory."""
    head, last = b"", b""
    async for chunk in resp.content.iter_any():
        *ended, rest = chunk.split(b"\n")
        for part in ended:
            line = (head + part[: HEAD - len(head)]).strip()
            if line.startswith(b"data: {") and b'"error"' in line[:16]:
                return "stream error event"
            if line:
                last = line
            head = b""
        head += rest[: HEAD - len(head)]
    last = head.strip() or last
    return None if last == b"data: [DONE]" else "stream cut"


async def _answer_failure(resp: aiohttp.ClientResponse) -> str | None:
    try:
        body = orjson.loads(await resp.read())
    except orjson.JSONDecodeError:
        return "bad answer (not JSON)"
    return None if isinstance(body, dict) and body.get("choices") else "bad answer (no choices)"


async def send_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    streamed: bool,
    headers: Mapping[str, str],
    limits: aiohttp.ClientTimeout,
) -> RequestOutcome:
    """Post `body` to `url` (the router's /v1/chat/completions) and say how it ended."""
    start = time.monotonic()
    answered = False
    failure: str | None
    try:
        async with session.post(url, data=body, headers=headers, timeout=limits) as resp:
            answered = True
            if resp.status != 200:
                await resp.read()
                failure = f"HTTP {resp.status}"
            elif streamed:
                failure = await _streamed_failure(resp)
            else:
                failure = await _answer_failure(resp)
    except TimeoutError:
        failure = "timeout"
    except aiohttp.ClientConnectorError:
        failure = "connection error"
    except aiohttp.ClientError:
        # bytes had come (or the headers had): the answer was cut; else the connection closed first
        failure = ("stream cut" if streamed else "answer cut") if answered else "connection closed"
    return RequestOutcome(time.monotonic() - start, streamed, failure)
