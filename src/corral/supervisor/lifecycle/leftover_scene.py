"""One supervisor's scene for the leftover check (`corral.supervisor.checks.leftovers`): its state dir,
its engine's processes and the sockets they hold, its preload daemon and that daemon's sockets, the
Unix sockets its dependency gates name, and the command it runs its engine with."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from corral.contracts.supervisor import LeftoverReport
from corral.engine.flags import loader_config
from corral.supervisor.checks.leftovers import (
    KnownProcess,
    RssProxy,
    Scene,
    host_rss,
    leftovers,
    unix_listeners,
)
from corral.supervisor.lifecycle.config import SupervisorConfig
from corral.supervisor.lifecycle.engine_process import EngineProcess
from corral.supervisor.lifecycle.preload import PreloadDaemon
from corral.supervisor.precheck.preload_pair import socket_dir


def engine_processes(engine: EngineProcess | None) -> tuple[KnownProcess, ...]:
    """The engine's process and every process of its tree still alive, ranks named (blocking)."""
    if engine is None or engine.identity is None:
        return ()
    root = engine.identity
    names = {r["pid"]: f"rank {r['rank']} ({r['name']})" for r in engine.ranks.ranks_json()}
    tree = engine.ranks.survivors()
    # and its descendants now: a process forked since the rank watch last looked has its parent's
    # command line, and must not read as a stray copy of the engine
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(root.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                tree.setdefault(child.pid, child.create_time())
    found = [KnownProcess(root.pid, root.create_time, "engine")]
    for pid, created in sorted(tree.items()):
        if pid != root.pid:
            found.append(KnownProcess(pid, created, names.get(pid, "engine child process")))
    return tuple(found)


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's processes and the Unix sockets they hold, read before an operation replaces it."""

    processes: tuple[KnownProcess, ...] = ()
    sockets: tuple[str, ...] = ()
    rss_bytes: int | None = None

    @classmethod
    def read(cls, engine: EngineProcess | None) -> EngineSnapshot:
        processes = engine_processes(engine)
        sockets = tuple(sorted(unix_listeners(p.pid for p in processes)))
        return cls(processes, sockets, host_rss(processes))

    @classmethod
    async def take(cls, engine: EngineProcess | None) -> EngineSnapshot:
        return await asyncio.to_thread(cls.read, engine)


def preload_sockets(engine_argv: Sequence[str], daemon_argv: Sequence[str]) -> tuple[str, ...]:
    """The daemon's socket: the path the engine's loader config or the daemon's command names, else
    every socket now in the socket directory they share (the default name carries the GPU's UUID)."""
    named = loader_config(engine_argv).get("socket_path")
    if isinstance(named, str):
        return (named,)
    if "--socket-path" in daemon_argv:
        i = list(daemon_argv).index("--socket-path")
        if i + 1 < len(daemon_argv):
            return (daemon_argv[i + 1],)
    directory, _ = socket_dir(engine_argv, daemon_argv)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return ()
    return tuple(sorted(e.path for e in entries if stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode)))


def backup_size(engine: EngineProcess | None, figures_weights: float | None) -> int | None:
    """What a level-1 sleep copies to host memory: the weights (the engine's figure, else the per-rank
    weights vLLM logged times the ranks that hold a share)."""
    if figures_weights is not None:
        return int(figures_weights)
    if engine is None or engine.log_figures.weights_bytes is None:
        return None
    return engine.log_figures.weights_bytes * max(1, engine.ranks.size.world)


def _tree(pid: int | None) -> frozenset[int]:
    """A process and its descendants now (a daemon run through a shell is the shell's child)."""
    if pid is None:
        return frozenset()
    found = {pid}
    with contextlib.suppress(psutil.Error):
        found.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return frozenset(found)


def scene_of(
    config: SupervisorConfig,
    engine: EngineProcess | None,
    preload: PreloadDaemon | None,
    *,
    before: EngineSnapshot | None = None,
    awake: bool = False,
    cpu_backup_bytes: float | None = None,
    rss: RssProxy | None = None,
    stopped: bool = False,
) -> Scene:
    """The scene now (blocking). `before`: the engine an operation replaced (its processes and
    sockets must be gone); `stopped`: everything was stopped (a shutdown), so nothing may remain."""
    current = engine_processes(engine) if not stopped else ()
    daemon_sockets = preload_sockets(config.engine_argv, config.preload_argv) if config.preload_argv else ()
    daemon_running = preload is not None and preload.running and not stopped
    held_now = set(unix_listeners(p.pid for p in current))
    gone = [s for s in (before.sockets if before else ()) if s not in held_now]
    served = [g.target for g in config.gates if g.kind == "unix"]
    if daemon_running:
        served += daemon_sockets
    else:
        gone += daemon_sockets
    return Scene(
        state_dirs=(Path(config.state_dir),),
        old=before.processes if before else (),
        engine_argvs=(tuple(config.engine_argv),),
        current=frozenset(p.pid for p in current),
        served_sockets=tuple(served),
        gone_sockets=tuple(gone),
        preload_argv=tuple(config.preload_argv),
        preload_sockets=daemon_sockets,
        preload_pids=_tree(preload.pid) if daemon_running and preload is not None else frozenset(),
        awake=awake,
        cpu_backup_bytes=cpu_backup_bytes,
        rss=rss,
    )


async def stopped_leftovers(
    config: SupervisorConfig, preload: PreloadDaemon | None, stopping: EngineSnapshot
) -> LeftoverReport:
    """After a shutdown stopped the engine (`stopping`: as it was before) and the daemon: nothing of
    either may remain."""
    return await asyncio.to_thread(
        lambda: leftovers(scene_of(config, None, preload, before=stopping, stopped=True))
    )
