"""The preload daemon's socket protocol, shared by `corral sim preload` and an engine started with
`--load-format ipc_cache`.

vLLM's daemon speaks length-prefixed pickle over a Unix socket; the simulator speaks length-prefixed JSON
with the same commands and answers: `get_state` with the engine's cache key (answered `ok`, `mismatch`
with the differing fields, or `error`), `get_memory`, and `release` (copy mode: the daemon drops its copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import struct
import tempfile
from typing import Any

import orjson

SIM_GPU_UUID = "GPU-00000000-sim0-0000-0000-000000000000"
_LEN = struct.Struct("!I")
MAX_MSG_BYTES = 16 * 2**20


class WeightCacheUnavailable(Exception):
    """No daemon answers on the socket (not started, still loading, gone) or it answered an error."""


class CacheConfigMismatch(Exception):
    """The daemon holds weights of another model, revision or layout."""


def default_socket_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"vllm_weight_cache_{os.getuid()}")


def socket_path_in(socket_dir: str | None) -> str:
    return os.path.join(socket_dir or default_socket_dir(), f"vllm_weight_cache_{SIM_GPU_UUID}.sock")


def default_fingerprint(model: str, version: str) -> str:
    """What identifies the weights: model and vLLM version (a real key also has revision, dtype, layout)."""
    return hashlib.sha1(f"{model}\0{version}".encode()).hexdigest()[:16]


def cache_key(model: str, fingerprint: str) -> dict[str, str]:
    return {"model": model, "fingerprint": fingerprint}


def mismatched_fields(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))


async def send_msg(writer: asyncio.StreamWriter, obj: Any) -> None:
    payload = orjson.dumps(obj)
    writer.write(_LEN.pack(len(payload)) + payload)
    await writer.drain()


async def recv_msg(reader: asyncio.StreamReader) -> Any:
    (length,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if length > MAX_MSG_BYTES:
        raise ValueError(f"Message size {length} exceeds limit {MAX_MSG_BYTES}")
    return orjson.loads(await reader.readexactly(length))


async def ask(socket_path: str, message: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """One request/answer exchange with the daemon; `WeightCacheUnavailable` when nobody answers."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path), limit_s)
    except (OSError, TimeoutError) as exc:
        raise WeightCacheUnavailable(
            f"Cannot connect to weight cache daemon at {socket_path}: {exc}"
        ) from exc
    try:
        await send_msg(writer, message)
        answer = await asyncio.wait_for(recv_msg(reader), limit_s)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        raise WeightCacheUnavailable(f"Weight cache daemon at {socket_path} did not answer: {exc!r}") from exc
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not isinstance(answer, dict):
        raise WeightCacheUnavailable(f"Weight cache daemon at {socket_path} sent {answer!r}")
    return answer
