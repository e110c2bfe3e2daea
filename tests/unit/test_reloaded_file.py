"""`corral.reloaded_file`: a file read again when its stamp changes, a failed read reported once per
change with the last good content kept (the router's backends and API keys files share it)."""

from __future__ import annotations

import os
from pathlib import Path

from corral.reloaded_file import ReloadedFile


def _read(path: Path) -> int:
    text = path.read_text()
    return int(text)  # ValueError for a bad edit; FileNotFoundError once the file is gone


def test_a_change_is_applied_and_a_failed_read_is_reported_once(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("1")
    applied: list[int] = []
    refused: list[str] = []
    file = ReloadedFile(
        path,
        _read,
        applied.append,
        lambda exc: refused.append(type(exc).__name__),
        (ValueError, OSError),
        task_name="test",
    )
    assert file.read_now() == 1
    assert not file.reload_if_changed()  # nothing changed since the first read
    path.write_text("22")
    assert file.reload_if_changed() and applied == [22]
    path.write_text("not a number")
    assert not file.reload_if_changed() and refused == ["ValueError"]
    assert not file.reload_if_changed() and refused == ["ValueError"]  # the same bad edit: once
    path.unlink()
    assert not file.reload_if_changed() and refused == ["ValueError", "FileNotFoundError"]
    assert not file.reload_if_changed() and len(refused) == 2
    path.write_text("3")
    assert file.reload_if_changed() and applied == [22, 3]


def test_an_edit_that_keeps_the_size_and_time_is_seen_by_its_inode(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("1")
    applied: list[int] = []
    file = ReloadedFile(path, _read, applied.append, lambda exc: None, (ValueError,), task_name="test")
    file.read_now()
    stat = path.stat()
    replacement = tmp_path / "n.new"
    replacement.write_text("2")
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    replacement.replace(path)  # an atomic rename: same size and time, another inode
    assert file.reload_if_changed() and applied == [2]
