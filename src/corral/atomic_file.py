"""Files replaced whole: the new content goes to a temp file beside the target, which is then renamed
over it, so a reader (or a crash) sees the old content or the new, never half of one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomically(
    path: Path, data: bytes, *, mode: int = 0o666, durable: bool = False, make_dirs: bool = True
) -> None:
    """Replace `path` with `data`. `mode` is the new file's permission bits (before the umask);
    `durable` also fsyncs the file and its directory, so the change survives a power cut; without
    `make_dirs` a missing directory is an error. Raises OSError, leaving no temp file behind."""
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
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
