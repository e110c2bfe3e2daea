"""`corral router --workers N`: N router processes sharing one listening port (SO_REUSEPORT, each its
own socket), each with an id of its own (`ROUTER_ID/wK`) at the supervisors, forked, restarted and
drained by the parent process, whose exit code says whether every worker ran and drained cleanly. The
parent makes the shared memory through which the workers route as one (`routing.worker_journal`)
before it forks them."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `--help` imports no routing
    from corral.router.flow.host_flows import HostFlowTables
    from corral.router.routing.worker_journal import WorkerJournals

log = logging.getLogger("corral.router.workers")

RESTART_BACKOFF_INITIAL = 0.5  # seconds before restarting a worker that died soon after its start
RESTART_BACKOFF_CAP = 30.0
STEADY_SECONDS = 10.0  # a worker that lived this long is restarted at once
KILL_GRACE = 5.0  # past the drain's shutdown timeout, a worker still running is killed
_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1


def cpu_limit(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: its CPU affinity, capped by its cgroup's CPU quota (a container's
    CPU limit, e.g. a Kubernetes pod's `resources.limits.cpu`), rounded up."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cgroup_cpu_quota(root: Path) -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 `cpu.max`, else v1 `cpu.cfs_quota_us`); None: no quota."""
    with contextlib.suppress(OSError, ValueError):
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    with contextlib.suppress(OSError, ValueError):
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """One worker's place among its siblings: what its process needs to know about itself."""

    index: int  # 1..count
    count: int
    run_dir: Path  # private to this router (0700): each worker's metrics socket
    restarted: bool = False  # a restart: a failure before it listens does not stop its siblings
    # the workers' shared routing state (picks, in-flight counts), made by the parent before forking
    journals: WorkerJournals | None = None
    # the workers' counts per flow, for flow control's slot shares (made with the journals when it is on)
    flow_tables: HostFlowTables | None = None

    @property
    def name(self) -> str:
        return f"w{self.index}"

    def router_id(self, base: str) -> str:
        """The worker's id in the supervisors' subscriptions and acknowledgements: the same across a
        restart, so a restarted worker resubscribes as itself (its dead stream closed; it is never
        waited for)."""
        return f"{base}/{self.name}"

    def socket_path(self, index: int) -> Path:
        return self.run_dir / f"w{index}.sock"

    def sibling_sockets(self) -> dict[str, Path]:
        """Every other worker's name -> the socket its own /metrics page is read from."""
        return {f"w{k}": self.socket_path(k) for k in range(1, self.count + 1) if k != self.index}


# The worker's body: run the router for `slot`, call `ready()` once it listens; returns its exit code.
WorkerMain = Callable[[WorkerSlot, Callable[[], None]], int]


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind (never listen on) `host:port` with SO_REUSEPORT, as each worker will: the port is checked
    free before any worker starts, stays this user's while workers restart, and port 0 becomes one
    port for all. A bound socket that does not listen takes no connections."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    held = socket.socket(family, kind, proto)
    try:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(address)
    except OSError:
        held.close()
        raise
    return held, int(held.getsockname()[1])


@dataclass
class _Worker:
    slot: WorkerSlot
    pid: int
    ready_fd: int  # the read end of its readiness pipe; closed at EOF
    started: float
    ready: bool = False


class WorkerPool:
    """The parent: forks `count` workers running `main`, restarts one that dies (backing off when it dies
    young), and on SIGTERM/SIGINT sends SIGTERM to every worker and waits for each to drain."""

    def __init__(
        self,
        count: int,
        main: WorkerMain,
        run_dir: Path,
        shutdown_timeout: float,
        journals: WorkerJournals | None = None,
    ) -> None:
        self.count = count
        self.journals = journals
        self.main = main
        self.run_dir = run_dir
        self.shutdown_timeout = shutdown_timeout
        self._workers: dict[int, _Worker] = {}  # pid -> worker
        self._due: dict[int, float] = {}  # slot index -> monotonic time of its restart
        self._backoff: dict[int, float] = {}  # slot index -> the wait before its next early restart
        self._failed: list[str] = []
        self._exit_code: int | None = None  # set once stopping: 0 on a signal, a failed start's code
        self._deadline: float | None = None  # stopping: kill what still runs after this
        self._serving_logged = False
        self._selector = selectors.DefaultSelector()
        self._close_in_child: list[int] = [self._selector.fileno()]
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def run(self) -> int:
        """Run the workers until a signal stops them (or the first start fails); the exit code: 0 when
        every worker drained cleanly and none died on the way, 1 otherwise, a failed start's own code."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self._previous = {sig: signal.signal(sig, _note_signal) for sig in _SIGNALS}
        previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        self._selector.register(wake_read, selectors.EVENT_READ, None)
        self._close_in_child += [wake_read, wake_write]
        try:
            for index in range(1, self.count + 1):
                self._start(WorkerSlot(index, self.count, self.run_dir, journals=self.journals))
            while self._workers or (self._due and self._exit_code is None):
                for key, _ in self._selector.select(self._timeout()):
                    if key.data is None:
                        self._on_signals(os.read(wake_read, 512))
                    else:
                        self._on_ready_pipe(key.data)
                self._reap()
                self._kill_past_deadline()
                self._restart_due()
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._selector.close()
            os.close(wake_read)
            os.close(wake_write)
        if self._exit_code is None or self._exit_code == 0:
            self._exit_code = 1 if self._failed else 0
        if self._failed:
            log.error("router workers failed: %s", "; ".join(self._failed))
        return self._exit_code

    # -- starting ------------------------------------------------------------------------------

    def _start(self, slot: WorkerSlot) -> None:
        if self.journals is not None:  # its siblings skip what an earlier life of it wrote
            self.journals.new_incarnation(slot.index)
        ready_read, ready_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            os.close(ready_read)
            self._become_worker(slot, ready_write, parent)
        os.close(ready_write)
        worker = _Worker(slot, pid, ready_read, time.monotonic())
        self._workers[pid] = worker
        self._selector.register(ready_read, selectors.EVENT_READ, worker)
        log.info("router worker %s started (pid %d)", slot.name, pid)

    def _become_worker(self, slot: WorkerSlot, ready_write: int, parent: int) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            for fd in (*self._close_in_child, *(w.ready_fd for w in self._workers.values())):
                os.close(fd)
            _die_with_parent(parent)

            def ready() -> None:
                os.write(ready_write, b"r")

            code = self.main(slot, ready)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:
            log.exception("router worker %s failed", slot.name)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    # -- what wakes the parent -----------------------------------------------------------------

    def _timeout(self) -> float | None:
        moments = [*self._due.values(), *([self._deadline] if self._deadline is not None else [])]
        return max(0.0, min(moments) - time.monotonic()) if moments else None

    def _on_signals(self, received: bytes) -> None:
        if any(sig in received for sig in (signal.SIGTERM, signal.SIGINT)) and self._exit_code is None:
            log.info("corral router stopping: draining %d workers", len(self._workers))
            self._stop(0)

    def _stop(self, code: int) -> None:
        self._exit_code = code
        self._due.clear()
        self._deadline = time.monotonic() + self.shutdown_timeout + KILL_GRACE
        for pid in self._workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _on_ready_pipe(self, worker: _Worker) -> None:
        if os.read(worker.ready_fd, 16):
            worker.ready = True
            serving = sum(w.ready for w in self._workers.values())
            if not self._serving_logged and serving == self.count:
                self._serving_logged = True
                log.info("corral router: all %d workers serving", self.count)
            return
        self._selector.unregister(worker.ready_fd)  # EOF: the worker is gone (reaped below)
        os.close(worker.ready_fd)
        worker.ready_fd = -1

    def _reap(self) -> None:
        while self._workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self._workers.pop(pid, None)
            if worker is not None:
                self._ended(worker, os.waitstatus_to_exitcode(status))

    def _ended(self, worker: _Worker, code: int) -> None:
        if worker.ready_fd >= 0:
            self._selector.unregister(worker.ready_fd)
            os.close(worker.ready_fd)
        slot, how = worker.slot, _how(code)
        if self.journals is not None:  # its siblings drop what it had in flight
            self.journals.new_incarnation(slot.index)
        if self._exit_code is not None:  # stopping: each must drain cleanly
            if code != 0:
                self._failed.append(f"{slot.name} (pid {worker.pid}) {how} while draining")
            return
        if not worker.ready and not slot.restarted:  # a first start that failed: the others stop too
            log.error("router worker %s (pid %d) %s before it listened; stopping", slot.name, worker.pid, how)
            self._stop(code if code > 0 else 1)
            return
        lived = time.monotonic() - worker.started
        if lived >= STEADY_SECONDS:
            self._backoff.pop(slot.index, None)
            backoff = 0.0
        else:
            backoff = self._backoff.get(slot.index, RESTART_BACKOFF_INITIAL)
            self._backoff[slot.index] = min(backoff * 2, RESTART_BACKOFF_CAP)
        self._failed.append(f"{slot.name} (pid {worker.pid}) {how}")
        log.warning(
            "router worker %s (pid %d) %s after %.1fs; restarting it in %.1fs",
            slot.name,
            worker.pid,
            how,
            lived,
            backoff,
        )
        self._due[slot.index] = time.monotonic() + backoff

    def _kill_past_deadline(self) -> None:
        if self._deadline is None or time.monotonic() < self._deadline:
            return
        for pid, worker in self._workers.items():
            log.error(
                "router worker %s (pid %d) still draining past the deadline: killed", worker.slot.name, pid
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._deadline = None

    def _restart_due(self) -> None:
        now = time.monotonic()
        for index, when in list(self._due.items()):
            if when <= now:
                del self._due[index]
                slot = WorkerSlot(index, self.count, self.run_dir, journals=self.journals)
                self._start(replace(slot, restarted=True))


def _note_signal(signum: int, frame: FrameType | None) -> None:
    """The parent's handler: the wakeup fd carries the signal to the loop; nothing to do here."""


def _how(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _die_with_parent(parent: int) -> None:
    """A worker gets SIGTERM when the parent dies (Linux), so no orphan keeps serving the port."""
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
