"""Ports of a local fleet: a free one for each member, and why the router's port cannot be used (with
the next free one)."""

from __future__ import annotations

import errno
import socket


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
