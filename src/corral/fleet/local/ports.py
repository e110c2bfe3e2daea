"""Ports of a local fleet: a free one for each member, and why the router's port cannot be used (with
the next free one).

A port handed to a child process is free when it is chosen and bound by the child a moment later. A port
from `bind(host, 0)` comes from the kernel's ephemeral range, the same range every outgoing connection on
the machine takes its local port from; under load one of those connections can take the port in that
moment and the child fails with "address already in use". So `free_port` chooses outside the ephemeral
range (`/proc/sys/net/ipv4/ip_local_port_range`), where the kernel hands out nothing by itself, checks that
nobody listens there or holds it in TIME_WAIT, and never hands out the same port twice in one process,
nor a port the process said it will listen on itself (`reserve`: `corral up`'s router port, which its
engines must not be given while the router has not bound it yet).
"""

from __future__ import annotations

import errno
import random
import socket
import threading
from pathlib import Path

_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below this: well-known and registered services people run by hand
_HIGHEST = 65535
_handed_out: set[int] = set()  # by number: 127.0.0.1:P and 0.0.0.0:P cannot both listen
_lock = threading.Lock()
_rng = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def _candidate_ranges() -> list[range]:
    low, high = _ephemeral_range()
    ranges = [range(_LOWEST, min(low, _HIGHEST + 1)), range(max(high + 1, _LOWEST), _HIGHEST + 1)]
    return [r for r in ranges if len(r) > 0]


def _free_now(host: str, port: int) -> bool:
    """Nobody listens on or is connected from `host:port`, and it is not in TIME_WAIT (no SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reserve(port: int) -> None:
    """`port` is this process's to listen on later: `free_port` never hands it to anyone."""
    with _lock:
        _handed_out.add(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that is free now, outside the kernel's ephemeral range, not handed out before by
    this process. Falls back to a kernel-chosen port when the machine leaves no range outside."""
    ranges = _candidate_ranges()
    with _lock:
        for _ in range(200 if ranges else 0):
            r = _rng.choice(ranges)
            port = _rng.randrange(r.start, r.stop)
            if port in _handed_out or not _free_now(host, port):
                continue
            _handed_out.add(port)
            return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the router binds: TIME_WAIT is no owner
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_problem(host: str, port: int) -> str | None:
    """Why the fleet cannot listen on `host:port` (with the next port that is free), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host"
        else:
            return None
    free = next((p for p in range(port + 1, min(port + 100, 65536)) if _bindable(host, p)), None)
    hint = f"; try --port {free}" if free is not None else "; pick another --port"
    return f"port {port} is in use by another process{hint}"
