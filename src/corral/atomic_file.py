"""Files replaced whole: the new content goes to a temp file beside the target, which is then renamed
over it, so a reader (or a crash) sees the old content or the new, never half of one.

A reader that polls such a file compares `file_stamp`s: a rename gives a new inode, an edit in place
a new modification time or size.

The temp file has a random name and is created with `O_EXCL`, so it is always a new file of ours:
never one another writer (or another process of the same PID, after a reboot) has open, and never
a symlink planted beside the target.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$")


def temp_name(path: Path) -> Path:
    """A fresh temp name beside `path` (`.NAME.<16 hex>.tmp`)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")


def is_temp_name(name: str) -> bool:
    """A name `temp_name` gives: such a file still there long after its write is a crash's leftover."""
    return _TEMP_NAME.match(name) is not None


def write_atomically(
    path: Path, data: bytes, *, mode: int = 0o600, durable: bool = False, make_dirs: bool = True
) -> None:
    """Replace `path` with `data`. `mode` is the new file's permission bits (state files are the
    owner's alone by default); `durable` also fsyncs the file and its directory, so the change
    survives a power cut; without `make_dirs` a missing directory is an error. Raises OSError,
    leaving no temp file behind."""
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)  # the umask never widens nor narrows what was asked
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when `path` is replaced or edited (modification time, size, inode); None while it
    cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
