"""The smoke requests `corral verify` and a rollout's new group answer: one non-streamed and one
streamed chat completion, each with usage and a finish reason, and the streamed one's time to first
token (one probe, not a steady-state figure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from corral.fleet.checks.check import FAIL, PASS, Check


@dataclass
class SmokeSample:
    check: Check
    ttft_ms: float | None = None


def _no_hint(status: int) -> str:
    return ""


async def smoke(
    base_url: str,
    model: str,
    headers: dict[str, str] | None = None,
    refused: Callable[[int], str] = _no_hint,
) -> SmokeSample:
    """One non-streamed and one streamed chat completion: usage and finish_reason on both (`headers`:
    the engine's key, or a tenant key for a router with tenants; `refused(status)`: what to do when
    `base_url` answers that status, put first in the check's detail)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "corral verify"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    limit = aiohttp.ClientTimeout(total=20)
    url = base_url + "/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body, headers=headers or {}, timeout=limit) as resp:
                if resp.status != 200:
                    hint = refused(resp.status)
                    said = hint or (await resp.text())[:200]
                    return SmokeSample(Check("smoke", FAIL, f"non-streamed: {resp.status}: {said}"))
                reply = await resp.json()
            finish = (reply.get("choices") or [{}])[0].get("finish_reason")
            if not finish or not (reply.get("usage") or {}).get("completion_tokens"):
                return SmokeSample(
                    Check("smoke", FAIL, f"non-streamed: finish {finish}, usage {reply.get('usage')}")
                )
            started = time.monotonic()
            ttft: float | None = None
            stream_finish, stream_usage = None, None
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with session.post(url, json=streamed, headers=headers or {}, timeout=limit) as resp:
                if resp.status != 200:
                    hint = refused(resp.status)
                    return SmokeSample(
                        Check("smoke", FAIL, f"streamed: {resp.status}" + (f": {hint}" if hint else ""))
                    )
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = orjson.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        if ttft is None and (choice.get("delta") or {}).get("content"):
                            ttft = (time.monotonic() - started) * 1000
                        stream_finish = choice.get("finish_reason") or stream_finish
                    stream_usage = chunk.get("usage") or stream_usage
            if not stream_finish or not stream_usage:
                detail = f"streamed: finish {stream_finish}, usage {stream_usage}"
                return SmokeSample(Check("smoke", FAIL, detail), ttft)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return SmokeSample(Check("smoke", FAIL, f"{url}: {type(exc).__name__} {exc}"))
    return SmokeSample(
        Check("smoke", PASS, f"via {base_url}: finish {finish}/{stream_finish}, usage on both"), ttft
    )
