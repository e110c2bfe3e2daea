"""The KV-cache events of a local fleet's engines under the prefix policy: each simulated engine publishes
them (as vLLM does with `--kv-events-config`) on Unix sockets in the fleet's private log directory, its
supervisor puts the address on its state stream, and the router (`--tokenizer sim`) indexes which engine
holds which prompt blocks. The events carry prompt tokens, so they never go on a TCP port."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from corral.engine.kv_events_address import KV_EVENTS_FLAG, kv_events_config_text

_SOCKET_PATH_MAX = 100  # a Unix socket's path is at most 107 bytes on Linux; keep a margin


def kv_events_args(log_dir: Path, engine: str, engine_args: Sequence[str]) -> list[str]:
    """`--kv-events-config` for a local engine under the prefix policy: its KV-cache events (which carry
    prompt tokens) published on Unix sockets in the fleet's private log directory, never on a TCP port;
    nothing when its bundle sets its own, or when the directory's path is too long for a socket."""
    if kv_events_config_text(engine_args) is not None:
        return []
    pub, replay = log_dir / f"{engine}.kv", log_dir / f"{engine}.kv-replay"
    if len(str(replay)) > _SOCKET_PATH_MAX:
        return []
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{pub}",
        "replay_endpoint": f"ipc://{replay}",
    }
    return [KV_EVENTS_FLAG, orjson.dumps(config).decode()]
