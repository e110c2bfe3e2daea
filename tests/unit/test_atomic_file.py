"""The atomic file writer: state files are the owner's alone, and the temp file is always a new
file under a random name (a planted symlink or a stale temp is never written through)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.atomic_file import write_atomically


def test_a_state_file_is_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "fleet.json"
    old = os.umask(0o000)
    try:
        write_atomically(target, b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_bytes() == b"{}"


def test_a_planted_symlink_at_the_old_temp_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    target = tmp_path / "state" / "backends"
    target.parent.mkdir()
    # the temp names an attacker (or a crashed writer of the same PID) could have guessed
    for name in (f".backends.{os.getpid()}.tmp", ".backends.tmp"):
        (target.parent / name).symlink_to(victim)
    write_atomically(target, b"new")
    assert victim.read_bytes() == b"untouched"
    assert target.read_bytes() == b"new" and not target.is_symlink()


def test_a_failed_replace_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a directory where the file should go: the rename fails
    with pytest.raises(OSError):
        write_atomically(target, b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
    assert list(target.iterdir()) == []


def test_durable_writes_replace_the_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "runtime_adapters.json"
    write_atomically(target, b"first, longer content", durable=True)
    write_atomically(target, b"second", durable=True)
    assert target.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["runtime_adapters.json"]
