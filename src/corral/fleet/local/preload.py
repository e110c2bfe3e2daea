"""`corral up --preload`: each engine of the local fleet gets its own weight-cache daemon under its
supervisor (`corral supervise --preload-command … --preload-health …`), as a host or a Kubernetes pod
runs one: `corral sim preload` on a health port and a private socket directory of its own, on the
bundle's vLLM (its `--version-string`: the simulator's cache key holds it, as vLLM's does), and the
engine loading from it (`--load-format ipc_cache`, zero_copy, falling back to disk as vLLM may).

A rollout starts new serving groups, each engine with a new daemon on the new bundle's version, and
retiring a group stops its supervisors, which stop their daemons after their engines: daemon and engine
move together, the daemon first, as the runbook asks.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corral.bundle_spec import BundleSpec
from corral.engine.flags import flag_value
from corral.fleet.local.ports import free_port

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class EngineDaemon:
    """One engine's daemon: the engine's loader flags and its supervisor's daemon flags."""

    engine_args: tuple[str, ...]
    supervisor_args: tuple[str, ...]


def engine_daemon(bundle: BundleSpec, model: str, sockets: Path) -> EngineDaemon:
    """A daemon for one engine of `bundle` serving `model`, its socket in a new directory under
    `sockets` (short: a unix socket path has 107 bytes; the fleet removes it when it stops)."""
    health = free_port(LOOPBACK)
    # its own 0700 directory: PRECHECK refuses a socket directory others can reach
    socket = Path(tempfile.mkdtemp(prefix="e", dir=sockets)) / "wc.sock"
    daemon = [sys.executable, "-m", "corral", "sim", "preload", "--model", model]
    daemon += ["--weight-cache-health-port", str(health), "--weight-cache-health-host", LOOPBACK]
    daemon += ["--socket-path", str(socket)]
    version = flag_value(bundle.engine_args, "--version-string")
    if version is not None:  # the same vLLM as the engine: one image, one version
        daemon += ["--version-string", version]
    loader = json.dumps({"socket_path": str(socket), "mode": "zero_copy", "fallback": True})
    return EngineDaemon(
        ("--load-format", "ipc_cache", "--model-loader-extra-config", loader),
        ("--preload-command", shlex.join(daemon), "--preload-health", f"http://{LOOPBACK}:{health}/health"),
    )
