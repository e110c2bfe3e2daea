"""The engine's development endpoints (`VLLM_SERVER_DEV_MODE=1`) as the supervisor calls them: sleep,
wake, KV release, weight reload, prefix-cache reset, and the figures VERIFY reads back (`/is_sleeping`,
`vllm:engine_sleep_state`, and memory where the engine exposes it).

Every call raises `AdminCallFailed` naming the endpoint, the HTTP status and the engine's own message,
so a failed runbook step says exactly which call failed and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from corral.engine.metric_names import (
    SIM_CPU_BACKUP,
    SIM_GPU_MEMORY,
    SIM_PREFIX_CACHE_BLOCKS,
    SIM_PREFIX_CACHE_RESETS,
    SIM_WEIGHTS_VALID,
    SLEEP_STATE,
)
from corral.engine.metrics_text import samples

_FIGURES = frozenset(
    {
        SLEEP_STATE,
        SIM_GPU_MEMORY,
        SIM_CPU_BACKUP,
        SIM_WEIGHTS_VALID,
        SIM_PREFIX_CACHE_BLOCKS,
        SIM_PREFIX_CACHE_RESETS,
    }
)
WAKE_TAGS = ("weights", "kv_cache", "scheduling")


class AdminCallFailed(Exception):
    """A development endpoint answered something other than success."""

    def __init__(self, call: str, status: int | None, message: str) -> None:
        shown = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"{call}: {shown}: {message[:300]}")
        self.call = call
        self.status = status


@dataclass(frozen=True)
class EngineFigures:
    """What the engine's /metrics says about sleep and memory at one moment."""

    sleep_state: str | None  # awake | weights_offloaded | discard_all | None (not reported)
    gpu_weights_bytes: float | None
    gpu_kv_cache_bytes: float | None
    cpu_backup_bytes: float | None
    weights_valid: float | None
    # the simulator's prefix cache: blocks cached now, whole-cache resets so far (vLLM shows neither)
    prefix_cache_blocks: float | None = None
    prefix_cache_resets: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def parse_figures(text: str) -> EngineFigures:
    sleep_state: str | None = None
    gpu: dict[str, float] = {}
    backup: float | None = None
    valid: float | None = None
    prefix: dict[str, float] = {}
    for sample in samples(text, _FIGURES, strict=True):
        if sample.name == SLEEP_STATE and sample.value == 1:
            sleep_state = sample.labels.get("sleep_state")
        elif sample.name == SIM_GPU_MEMORY:
            kind = sample.labels.get("kind", "")
            gpu[kind] = gpu.get(kind, 0.0) + sample.value
        elif sample.name == SIM_CPU_BACKUP:
            backup = sample.value
        elif sample.name == SIM_WEIGHTS_VALID:
            valid = sample.value
        elif sample.name in (SIM_PREFIX_CACHE_BLOCKS, SIM_PREFIX_CACHE_RESETS):
            prefix[sample.name] = sample.value
    return EngineFigures(
        sleep_state,
        gpu.get("weights"),
        gpu.get("kv_cache"),
        backup,
        valid,
        prefix.get(SIM_PREFIX_CACHE_BLOCKS),
        prefix.get(SIM_PREFIX_CACHE_RESETS),
    )


class EngineAdmin:
    """Calls one engine's development endpoints."""

    def __init__(self, session: aiohttp.ClientSession, engine_url: str, timeout: float = 120.0) -> None:
        self._session = session
        self.engine_url = engine_url.rstrip("/")
        self.timeout = timeout

    async def _call(
        self,
        method: str,
        path: str,
        params: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        call = f"{method} {path}" + ("?" + "&".join(f"{k}={v}" for k, v in params) if params else "")
        try:
            async with self._session.request(
                method,
                self.engine_url + path,
                params=params,
                data=orjson.dumps(body) if body is not None else None,
                headers={"content-type": "application/json"} if body is not None else None,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise AdminCallFailed(call, resp.status, raw.decode(errors="replace"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AdminCallFailed(call, None, f"{type(exc).__name__}: {exc}") from exc
        try:
            return orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return raw.decode(errors="replace")

    async def dev_mode(self) -> bool:
        """Whether the development endpoints exist (they answer 404 without VLLM_SERVER_DEV_MODE=1)."""
        try:
            await self.is_sleeping()
        except AdminCallFailed as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def sleep(self, level: int, mode: str) -> Any:
        return await self._call("POST", "/sleep", [("level", str(level)), ("mode", mode)])

    async def wake_up(self, tags: list[str] | None = None) -> Any:
        return await self._call("POST", "/wake_up", [("tags", t) for t in tags or []])

    async def is_sleeping(self) -> bool:
        body = await self._call("GET", "/is_sleeping")
        return bool(isinstance(body, dict) and body.get("is_sleeping"))

    async def release_kv_cache(self) -> Any:
        return await self._call("POST", "/release_kv_cache_memory")

    async def reload_weights(self) -> Any:
        return await self._call("POST", "/collective_rpc", body={"method": "reload_weights"})

    async def reset_prefix_cache(self) -> bool | None:
        """`POST /reset_prefix_cache`: vLLM's `{"success": bool}` (false while running requests hold
        blocks), or None from a vLLM that answers an empty 200 without saying."""
        body = await self._call("POST", "/reset_prefix_cache")
        success = body.get("success") if isinstance(body, dict) else None
        return success if isinstance(success, bool) else None

    async def figures(self) -> EngineFigures:
        try:
            async with self._session.get(
                self.engine_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5.0)
            ) as resp:
                if resp.status != 200:
                    raise AdminCallFailed("GET /metrics", resp.status, "")
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AdminCallFailed("GET /metrics", None, f"{type(exc).__name__}: {exc}") from exc
        return parse_figures(text)
