"""The ipc_cache loader against an in-process preload daemon: config checks, mapping, fallback, failure."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.sim.core.logs import EngineLog
from corral.sim.weights.preload import DaemonConfig, WeightCacheDaemon
from corral.sim.weights.weight_cache import (
    CacheConfigMismatch,
    WeightCacheUnavailable,
    cache_key,
    default_fingerprint,
)
from corral.sim.weights.weight_loader import IpcLoadConfig, WeightLoader

KEY = cache_key("m", default_fingerprint("m", "0.33.0"))


def test_extra_config_defaults_and_refusals() -> None:
    cfg = IpcLoadConfig.parse('{"socket_path": "/s.sock"}')
    assert (cfg.socket_path, cfg.mode, cfg.fallback) == ("/s.sock", "zero_copy", True)
    with pytest.raises(ValueError, match="Unexpected extra config keys"):
        IpcLoadConfig.parse('{"socket_path": "/s", "bogus": 1}')
    with pytest.raises(ValueError, match="Invalid weight cache mode"):
        IpcLoadConfig.parse('{"mode": "mmap"}')
    assert IpcLoadConfig.parse('{"socket_dir": "/d"}').socket_path.startswith("/d/vllm_weight_cache_")


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[tuple[WeightCacheDaemon, str]]:
    sock = str(tmp_path / "wc.sock")
    d = WeightCacheDaemon(
        DaemonConfig("m", sock, KEY["fingerprint"], startup_seconds=0.0), EngineLog(io.StringIO())
    )
    task = asyncio.create_task(d.run(handle_signals=False))
    for _ in range(1000):
        if d.ready:
            break
        await asyncio.sleep(0.005)
    yield d, sock
    d.stop()
    await task


def _loader(sock: str, key: dict[str, str] = KEY, **extra: object) -> tuple[WeightLoader, io.StringIO]:
    out = io.StringIO()
    cfg = IpcLoadConfig(socket_path=sock, connect_timeout_s=1.0, **extra)  # type: ignore[arg-type]
    return WeightLoader(cfg, key, EngineLog(out)), out


async def test_matching_daemon_maps_its_tensors(daemon: tuple[WeightCacheDaemon, str]) -> None:
    loader, out = _loader(daemon[1])
    outcome = await loader.load()
    assert outcome.from_daemon and outcome.mode == "zero_copy" and outcome.tensors > 0
    assert "Mapped" in out.getvalue() and "zero_copy mode" in out.getvalue()


async def test_copy_mode_makes_the_daemon_release_so_the_next_engine_falls_back(
    daemon: tuple[WeightCacheDaemon, str],
) -> None:
    d, sock = daemon
    loader, _ = _loader(sock, mode="copy")
    assert (await loader.load()).from_daemon
    assert d.released
    again, out = _loader(sock, mode="copy")
    outcome = await again.load()
    assert outcome.source == "disk_fallback" and "Weights were released" in out.getvalue()


async def test_missing_daemon_falls_back_to_disk_with_vllms_warning(tmp_path: Path) -> None:
    loader, out = _loader(str(tmp_path / "none.sock"))
    outcome = await loader.load()
    assert outcome.source == "disk_fallback"
    assert "Weight cache unusable (" in out.getvalue()
    assert "); falling back to disk loading" in out.getvalue()


async def test_mismatch_falls_back_with_fallback_and_raises_without(
    daemon: tuple[WeightCacheDaemon, str],
) -> None:
    other = cache_key("m", "another-revision")
    loader, out = _loader(daemon[1], other)
    assert (await loader.load()).source == "disk_fallback"
    assert "mismatch on fields: ['fingerprint']" in out.getvalue()
    strict, _ = _loader(daemon[1], other, fallback=False)
    with pytest.raises(CacheConfigMismatch):
        await strict.load()


async def test_without_fallback_a_missing_daemon_is_waited_for_then_fatal(tmp_path: Path) -> None:
    loader, out = _loader(str(tmp_path / "none.sock"), fallback=False, state_timeout_s=0.3)
    with pytest.raises(WeightCacheUnavailable, match=r"did not become ready within 0\.3s"):
        await loader.load()
    assert "Waiting up to 0.3s" in out.getvalue()
