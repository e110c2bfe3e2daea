"""Where the engine's weights come from at startup: disk, or a preload daemon (`--load-format ipc_cache`).

As vLLM's `IpcModelLoader`: `--model-loader-extra-config` takes `socket_path` / `socket_dir`, `mode`
(`zero_copy` default, or `copy`), `fallback` (default true), `connect_timeout_s` (5) and `state_timeout_s`
(300); other keys are refused. With fallback the engine asks once and, if the daemon is missing, unready or
holds other weights, logs `Weight cache unusable (...); falling back to disk loading` and loads from disk
(slowly). Without fallback it waits up to `state_timeout_s` for a daemon to answer, and a mismatch is fatal.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson

from corral.sim.core.logs import EngineLog
from corral.sim.weights.weight_cache import (
    CacheConfigMismatch,
    WeightCacheUnavailable,
    ask,
    socket_path_in,
)

_KNOWN_KEYS = ("socket_path", "socket_dir", "mode", "fallback", "connect_timeout_s", "state_timeout_s")
_RETRY_INTERVAL_S = 1.0


@dataclass(frozen=True)
class IpcLoadConfig:
    socket_path: str
    mode: str = "zero_copy"
    fallback: bool = True
    connect_timeout_s: float = 5.0
    state_timeout_s: float = 300.0

    @classmethod
    def parse(cls, extra_config: str | None) -> IpcLoadConfig:
        """The loader settings from the JSON of `--model-loader-extra-config`; ValueError like vLLM's."""
        raw: Any = orjson.loads(extra_config) if extra_config else {}
        if not isinstance(raw, dict):
            raise ValueError(f"--model-loader-extra-config must be a JSON object, got {extra_config!r}")
        unknown = sorted(set(raw) - set(_KNOWN_KEYS))
        if unknown:
            raise ValueError(f"Unexpected extra config keys for load format ipc_cache: {unknown}")
        mode = raw.get("mode", "zero_copy")
        if mode not in ("zero_copy", "copy"):
            raise ValueError(f"Invalid weight cache mode {mode!r}, expected 'zero_copy' or 'copy'")
        path = raw.get("socket_path") or socket_path_in(raw.get("socket_dir"))
        return cls(
            socket_path=str(path),
            mode=mode,
            fallback=bool(raw.get("fallback", True)),
            connect_timeout_s=float(raw.get("connect_timeout_s", 5.0)),
            state_timeout_s=float(raw.get("state_timeout_s", 300.0)),
        )


@dataclass(frozen=True)
class LoadOutcome:
    """How the weights were loaded: `disk`, `ipc_cache` or `disk_fallback` (with the reason)."""

    source: str
    mode: str = ""
    tensors: int = 0
    reason: str | None = None

    @property
    def from_daemon(self) -> bool:
        return self.source == "ipc_cache"


class WeightLoader:
    def __init__(self, config: IpcLoadConfig, key: dict[str, str], log: EngineLog) -> None:
        self.config = config
        self.key = key
        self.log = log

    async def _fetch_state(self) -> dict[str, Any]:
        answer = await ask(
            self.config.socket_path,
            {"cmd": "get_state", "cache_config": self.key},
            self.config.connect_timeout_s,
        )
        status = answer.get("status")
        if status == "mismatch":
            raise CacheConfigMismatch(f"WeightCacheKey mismatch on fields: {answer.get('fields')}")
        if status != "ok":
            raise WeightCacheUnavailable(f"Weight cache daemon error: {answer.get('message')}")
        return answer

    async def _fetch_state_waiting(self) -> dict[str, Any]:
        """Without fallback the daemon may still be loading: retry until `state_timeout_s`."""
        deadline = time.monotonic() + self.config.state_timeout_s
        noted = False
        while True:
            try:
                return await self._fetch_state()
            except WeightCacheUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise WeightCacheUnavailable(
                        f"Weight cache daemon did not become ready within "
                        f"{self.config.state_timeout_s:.1f}s: {exc}"
                    ) from exc
                if not noted:
                    limit = self.config.state_timeout_s
                    self.log.info(
                        "Worker",
                        "ipc_loader.py:380",
                        f"Waiting up to {limit:.1f}s for the weight cache daemon to start",
                    )
                    noted = True
                await asyncio.sleep(max(0.0, min(_RETRY_INTERVAL_S, deadline - time.monotonic())))

    async def load(self) -> LoadOutcome:
        """Map the daemon's weights; raises when that fails and fallback is off."""
        cfg = self.config
        try:
            state = await (self._fetch_state() if cfg.fallback else self._fetch_state_waiting())
        except (WeightCacheUnavailable, CacheConfigMismatch) as exc:
            if not cfg.fallback:
                raise
            self.log.warning(
                "Worker", "ipc_loader.py:217", f"Weight cache unusable ({exc}); falling back to disk loading"
            )
            return LoadOutcome("disk_fallback", cfg.mode, reason=str(exc))
        tensors = int(state.get("entries", 0))
        if cfg.mode == "copy":
            try:
                await ask(cfg.socket_path, {"cmd": "release"}, cfg.connect_timeout_s)
            except WeightCacheUnavailable:
                self.log.warning(
                    "Worker", "ipc_loader.py:459", "Failed to ask the weight cache daemon to release"
                )
        self.log.info(
            "Worker",
            "ipc_loader.py:284",
            f"Mapped {tensors} tensors from the weight cache daemon ({cfg.mode} mode)",
        )
        return LoadOutcome("ipc_cache", cfg.mode, tensors)
