"""What an operation may leave behind, looked for: old engine processes and ranks, sockets nobody
serves or that should be gone, a CPU weight backup still held once awake, preload daemons that are not
the supervisor's own, and temp files of atomic writes. Each detector names what it found (path, pid,
bytes), says `clean` only after it looked, and `not_measured` when it could not look.

Whether a find fails POSTCHECK is decided per kind (`FAILS`): what holds device or host memory fails
(an old engine or rank, an orphaned daemon, a backup the engine itself reports); what only clutters
(a stale socket file, a temp file) is a warning.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from corral.atomic_file import is_temp_name
from corral.contracts.supervisor import Leftover, LeftoverCheck, LeftoverReport
from corral.process_identity import live_process

OLD_PROCESS = "old_process"
STALE_SOCKET = "stale_socket"
CPU_BACKUP = "cpu_backup"
ORPHANED_DAEMON = "orphaned_daemon"
TEMP_FILE = "temp_file"

# a find of this kind fails POSTCHECK (True) or is a warning (False)
FAILS = {
    OLD_PROCESS: True,  # holds device memory the next engine needs
    ORPHANED_DAEMON: True,  # holds a copy of the weights on the device
    CPU_BACKUP: True,  # the engine's own figure: the wake left host memory the size of the weights
    STALE_SOCKET: False,  # a file: the next bind or a dependency gate trips on it, nothing is held
    TEMP_FILE: False,  # a file of a write that never finished
}
TEMP_MIN_AGE_S = 60.0  # younger temp files may be a write in progress
BACKUP_FREED_SHARE = 0.5  # the RSS proxy: the wake gave back at least this share of the backup size


@dataclass(frozen=True)
class KnownProcess:
    """A process seen before (pid and start time, so a reused pid is not mistaken for it)."""

    pid: int
    create_time: float
    label: str


@dataclass(frozen=True)
class RssProxy:
    """A real vLLM reports no CPU backup figure: the host RSS of the engine's processes while asleep
    and once awake, against the size the backup had (the weights), is the proxy."""

    asleep_bytes: int
    awake_bytes: int
    backup_bytes: int | None


def _check(kind: str, found: list[Leftover], clean: str, fails: bool | None = None) -> LeftoverCheck:
    if not found:
        return LeftoverCheck(kind=kind, verdict="clean", reason=clean, fails=FAILS[kind])
    reason = "; ".join(f.what for f in found)
    return LeftoverCheck(
        kind=kind, verdict="found", reason=reason, fails=FAILS[kind] if fails is None else fails, found=found
    )


def _not_measured(kind: str, why: str) -> LeftoverCheck:
    return LeftoverCheck(kind=kind, verdict="not_measured", reason=why, fails=FAILS[kind])


def _rss(proc: psutil.Process) -> int | None:
    try:
        return int(proc.memory_info().rss)
    except psutil.Error:
        return None


def host_rss(processes: Iterable[KnownProcess]) -> int | None:
    """The resident host memory of the processes still alive (None when none is)."""
    sizes = [_rss(p) for k in processes if (p := live_process(k.pid, k.create_time)) is not None]
    known = [s for s in sizes if s is not None]
    return sum(known) if known else None


Processes = list[tuple[psutil.Process, tuple[str, ...]]]  # this user's processes and their command lines


def own_processes() -> Processes:
    """This user's processes, read once per look, but this one and its ancestors (whose command lines
    end with the engine's command: `corral supervise ... -- CMD`, and whatever wraps it)."""
    uid = os.getuid()
    me = psutil.Process()
    skip = {me.pid, *(p.pid for p in me.parents())}
    found: Processes = []
    for proc in psutil.process_iter(["uids", "cmdline"]):
        uids = proc.info.get("uids")
        if uids is not None and uids.real == uid and proc.pid not in skip:
            found.append((proc, tuple(proc.info.get("cmdline") or ())))
    return found


def runs_command(cmdline: Sequence[str], argv: Sequence[str]) -> bool:
    """The process runs `argv`: the same words, or `argv[0]` found through an interpreter (a console
    script's cmdline is `python /path/corral sim ...` for the command `corral sim ...`)."""
    if not argv or len(cmdline) < len(argv):
        return False
    if tuple(cmdline) == tuple(argv):
        return True
    start = len(cmdline) - len(argv)
    return tuple(cmdline[start + 1 :]) == tuple(argv[1:]) and os.path.basename(
        cmdline[start]
    ) == os.path.basename(argv[0])


def old_processes(
    previous: Sequence[KnownProcess],
    engine_argvs: Collection[tuple[str, ...]] = (),
    current: Collection[int] = (),
    processes: Processes | None = None,
) -> LeftoverCheck:
    """An engine process or rank from before (`previous`), or a process running one of this
    supervisor's engine commands (`engine_argvs`) outside the current engine's tree (`current`)."""
    if not previous and not engine_argvs:
        return _not_measured(OLD_PROCESS, "no earlier engine process or engine command known")
    found: list[Leftover] = []
    named: set[int] = set()
    for known in previous:
        proc = live_process(known.pid, known.create_time)
        if proc is None or known.pid in current:
            continue
        named.add(known.pid)
        rss = _rss(proc)
        found.append(
            Leftover(
                kind=OLD_PROCESS,
                what=f"{known.label} (pid {known.pid}) still runs"
                + (f", {rss} bytes resident" if rss else ""),
                pid=known.pid,
                bytes=rss,
            )
        )
    if engine_argvs:
        for proc, cmdline in own_processes() if processes is None else processes:
            if proc.pid in current or proc.pid in named:
                continue
            if not any(runs_command(cmdline, argv) for argv in engine_argvs):
                continue
            rss = _rss(proc)
            found.append(
                Leftover(
                    kind=OLD_PROCESS,
                    what=f"pid {proc.pid} runs this supervisor's engine command outside the engine it "
                    "supervises" + (f", {rss} bytes resident" if rss else ""),
                    pid=proc.pid,
                    bytes=rss,
                )
            )
    parts = [f"none of {len(previous)} earlier engine processes alive"] if previous else []
    if engine_argvs:
        parts.append("no process runs the engine command outside the engine")
    return _check(OLD_PROCESS, found, "; ".join(parts))


def unix_listeners(pids: Iterable[int]) -> dict[str, int]:
    """The Unix socket paths the processes hold bound (path -> pid); abstract sockets left out."""
    bound: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="unix"):
                path = conn.laddr
                if isinstance(path, str) and path.startswith("/"):
                    bound.setdefault(path, pid)
    return bound


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def stale_sockets(served: Iterable[str] = (), gone: Iterable[str] = ()) -> LeftoverCheck:
    """`served`: sockets that may exist but must then answer (a socket file nobody listens on is a dead
    process's leftover); `gone`: sockets of something stopped, which must not exist at all."""
    found: list[Leftover] = []
    looked = 0
    for path in dict.fromkeys(served):
        looked += 1
        if _is_socket(path) and not _answers(path):
            found.append(
                Leftover(kind=STALE_SOCKET, what=f"socket {path} exists but nobody listens", path=path)
            )
    for path in dict.fromkeys(gone):
        looked += 1
        if os.path.lexists(path):
            how = "still accepts connections" if _answers(path) else "nobody listens"
            found.append(
                Leftover(
                    kind=STALE_SOCKET, what=f"socket {path} of a stopped process remains ({how})", path=path
                )
            )
    if not looked:
        return _not_measured(STALE_SOCKET, "no socket path known to look at")
    return _check(STALE_SOCKET, found, f"{looked} socket paths looked at: none stale")


def cpu_backup(backup_bytes: float | None, proxy: RssProxy | None = None) -> LeftoverCheck:
    """Once awake, no CPU copy of the weights: the engine's own figure (the simulator's
    `corral_sim_cpu_backup_bytes`), else the host RSS proxy (a warning only: RSS moves for other
    reasons too), else not measured."""
    if backup_bytes is not None:
        if backup_bytes > 0:
            held = int(backup_bytes)
            what = f"the engine reports a CPU weight backup of {held} bytes while awake"
            return _check(CPU_BACKUP, [Leftover(kind=CPU_BACKUP, what=what, bytes=held)], "")
        return _check(CPU_BACKUP, [], "the engine reports no CPU weight backup (0 bytes)")
    if proxy is None:
        return _not_measured(CPU_BACKUP, "the engine reports no CPU backup figure and no host RSS was read")
    freed = proxy.asleep_bytes - proxy.awake_bytes
    figures = f"host RSS {proxy.asleep_bytes} bytes asleep, {proxy.awake_bytes} awake (proxy)"
    if proxy.backup_bytes is None:
        return _not_measured(CPU_BACKUP, f"{figures}; the backup's size (the weights) is not known")
    if freed >= BACKUP_FREED_SHARE * proxy.backup_bytes:
        return _check(
            CPU_BACKUP, [], f"{figures}: {freed} bytes given back of a {proxy.backup_bytes}-byte backup"
        )
    what = f"{figures}: only {max(freed, 0)} bytes given back of a {proxy.backup_bytes}-byte backup"
    held = proxy.backup_bytes - max(freed, 0)
    return _check(CPU_BACKUP, [Leftover(kind=CPU_BACKUP, what=what, bytes=held)], "", fails=False)


def _holders(paths: Iterable[str]) -> dict[int, set[str]]:
    """Which processes hold which of `paths` bound (pid -> paths), in one read of the socket table."""
    wanted = set(paths)
    held: dict[int, set[str]] = {}
    if not wanted:
        return held
    with contextlib.suppress(psutil.Error):
        for conn in psutil.net_connections(kind="unix"):
            if conn.pid is not None and isinstance(conn.laddr, str) and conn.laddr in wanted:
                held.setdefault(conn.pid, set()).add(conn.laddr)
    return held


def orphaned_daemons(
    daemon_argv: Sequence[str],
    sockets: Iterable[str],
    own: Collection[int],
    processes: Processes | None = None,
) -> LeftoverCheck:
    """A weight-cache daemon that is not the supervisor's own (`own`: its daemon's process tree, empty
    once it is stopped):
    one running the daemon command, or one holding a daemon socket; each holds a copy of the weights."""
    argv = tuple(daemon_argv)
    holding = _holders(sockets)
    found: list[Leftover] = []
    for proc, cmdline in own_processes() if processes is None else processes:
        if proc.pid in own:
            continue
        held = sorted(holding.get(proc.pid, ()))
        if not runs_command(cmdline, argv) and not held:
            continue
        why = f"holds {', '.join(held)}" if held else "runs the preload command"
        rss = _rss(proc)
        found.append(
            Leftover(
                kind=ORPHANED_DAEMON,
                what=f"preload daemon pid {proc.pid} is not this supervisor's ({why})",
                pid=proc.pid,
                path=held[0] if held else None,
                bytes=rss,
            )
        )
    return _check(ORPHANED_DAEMON, found, "no preload daemon but the supervisor's own")


def temp_files(
    dirs: Iterable[Path], min_age_s: float = TEMP_MIN_AGE_S, now: float | None = None
) -> LeftoverCheck:
    """Temp files of atomic writes (`corral.atomic_file`) older than `min_age_s`: a write that died."""
    now = time.time() if now is None else now
    found: list[Leftover] = []
    unreadable: list[str] = []
    looked = 0
    for directory in dict.fromkeys(dirs):
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            unreadable.append(f"{directory}: {exc.strerror or exc}")
            continue
        looked += 1
        for entry in entries:
            if not is_temp_name(entry.name):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if now - st.st_mtime >= min_age_s:
                    age = now - st.st_mtime
                    found.append(
                        Leftover(
                            kind=TEMP_FILE,
                            what=f"temp file {entry.path} ({st.st_size} bytes, {age:.0f}s old)",
                            path=entry.path,
                            bytes=st.st_size,
                        )
                    )
    if unreadable and not found:
        return _not_measured(TEMP_FILE, "cannot read " + "; ".join(unreadable))
    if not looked and not found:
        return _not_measured(TEMP_FILE, "no directory to look in")
    return _check(TEMP_FILE, found, f"no temp file older than {min_age_s:g}s in {looked} directories")


@dataclass(frozen=True)
class Scene:
    """What one look needs: where this supervisor writes, what ran before and runs now, what the
    engine reports. A detector runs only where its part of the scene applies."""

    state_dirs: tuple[Path, ...] = ()
    old: tuple[KnownProcess, ...] = ()  # the engine and ranks of before an operation
    engine_argvs: tuple[tuple[str, ...], ...] = ()  # every command this supervisor may run its engine with
    current: frozenset[int] = frozenset()  # the engine's tree now
    served_sockets: tuple[str, ...] = ()
    gone_sockets: tuple[str, ...] = ()
    preload_argv: tuple[str, ...] = ()
    preload_sockets: tuple[str, ...] = ()
    preload_pids: frozenset[int] = frozenset()  # the supervisor's daemon and its descendants
    awake: bool = False  # the engine is awake: no CPU backup may remain
    cpu_backup_bytes: float | None = None
    rss: RssProxy | None = None
    skip: frozenset[str] = field(default_factory=frozenset)


def leftovers(scene: Scene) -> LeftoverReport:
    """Every detector that applies to `scene` (blocking: psutil and the file system; run it off the loop)."""
    processes = own_processes() if scene.engine_argvs or scene.preload_argv else []
    checks = [
        old_processes(scene.old, scene.engine_argvs, scene.current, processes),
        stale_sockets(scene.served_sockets, scene.gone_sockets),
    ]
    if scene.awake:
        checks.append(cpu_backup(scene.cpu_backup_bytes, scene.rss))
    if scene.preload_argv:  # a daemon someone else runs (a sidecar) is not ours to call orphaned
        checks.append(
            orphaned_daemons(scene.preload_argv, scene.preload_sockets, scene.preload_pids, processes)
        )
    checks.append(temp_files(scene.state_dirs))
    return LeftoverReport(checked_at=time.time(), checks=[c for c in checks if c.kind not in scene.skip])
