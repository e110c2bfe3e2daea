"""One streamed request, classified the way the zero-loss tests count it: completed, failed before
the stream began (a request the router should have retried elsewhere), or broken mid-stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class StreamOutcome:
    kind: str  # "completed" | "failed_before_stream" | "broken"
    detail: str = ""
    events: list[bytes] = field(default_factory=list)

    def payloads(self) -> list[dict[str, Any]]:
        """The JSON events before `[DONE]`."""
        return [orjson.loads(e) for e in self.events if e != b"[DONE]"]


async def stream_once(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> StreamOutcome:
    """POST `body` (a streaming request) to `url` and read the SSE answer to its end."""
    try:
        resp = await session.post(url, data=orjson.dumps(body), headers={"content-type": "application/json"})
    except aiohttp.ClientError as exc:
        return StreamOutcome("failed_before_stream", f"connect: {exc!r}")
    async with resp:
        if resp.status != 200:
            return StreamOutcome("failed_before_stream", f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
        events: list[bytes] = []
        try:
            async for line in resp.content:
                if line.startswith(b"data: "):
                    events.append(line[6:].strip())
        except aiohttp.ClientError as exc:
            return StreamOutcome("broken", f"cut after {len(events)} events: {exc!r}", events)
    if not events or events[-1] != b"[DONE]" or any(e.startswith(b'{"error"') for e in events):
        return StreamOutcome("broken", f"ended badly: {events[-3:]!r}", events)
    return StreamOutcome("completed", "", events)
