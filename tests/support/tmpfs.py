"""A tiny tmpfs for tests that need a real full (or read-only) disk: mounted for the test, then
unmounted. Needs root: the test is skipped where mounting is not allowed, unless CORRAL_REQUIRE_ROOT=1
(set by CI, which runs as root), which turns that skip into a failure."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest


def _cannot(why: str) -> NoReturn:
    if os.environ.get("CORRAL_REQUIRE_ROOT") == "1":
        pytest.fail(f"CORRAL_REQUIRE_ROOT=1 but {why}")
    pytest.skip(why)


@contextlib.contextmanager
def tiny_tmpfs(size: str = "256k", read_only: bool = False) -> Iterator[Path]:
    if os.geteuid() != 0:
        _cannot("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="corral-tmpfs-", dir="/tmp"))
    options = f"size={size},mode=0755" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        where.rmdir()
        _cannot(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def fill(disk: Path) -> int:
    """Write one file until the disk is full; returns the bytes it took."""
    written = 0
    with (disk / "filler").open("wb", buffering=0) as fh:
        with contextlib.suppress(OSError):
            while True:
                written += fh.write(b"\0" * 4096)
    return written
