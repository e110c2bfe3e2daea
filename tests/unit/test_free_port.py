"""`free_port` hands a child a port the kernel will not give to an outgoing connection in the meantime."""

from __future__ import annotations

import socket

import pytest

from corral.fleet.local import ports


def test_ports_come_from_outside_the_ephemeral_range_and_are_not_repeated() -> None:
    low, high = ports._ephemeral_range()
    handed = [ports.free_port("127.0.0.1") for _ in range(200)]
    assert len(set(handed)) == len(handed)
    inside = [p for p in handed if low <= p <= high]
    assert inside == [], f"ephemeral range {low}-{high}, handed out {inside}"
    for port in handed[:20]:  # and each is free to listen on
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    start = ports.free_port("127.0.0.1")
    window = range(start, start + 8)
    monkeypatch.setattr(ports, "_candidate_ranges", lambda: [window])
    monkeypatch.setattr(ports, "_handed_out", set())
    taken = []
    try:
        for port in window:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()  # somebody else's already: busy as well
                continue
            s.listen()
            taken.append(s)
        free = taken.pop()
        free_number = free.getsockname()[1]
        free.close()
        assert ports.free_port("127.0.0.1") == free_number  # the only one in the window nobody holds
    finally:
        for s in taken:
            s.close()


def test_a_reserved_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """`corral up` reserves its router port: the engines it starts first never get it."""
    start = ports.free_port("127.0.0.1")  # free, and the only candidate: unreserved, it would be chosen
    monkeypatch.setattr(ports, "_candidate_ranges", lambda: [range(start, start + 1)])
    monkeypatch.setattr(ports, "_handed_out", set())
    ports.reserve(start)
    handed = ports.free_port("127.0.0.1")
    assert handed != start  # the kernel's pick instead
