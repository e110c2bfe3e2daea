"""Membership from a backends file (`--backends-file`): one engine URL per line, `#` comments;
the file is read again whenever its modification time, size or inode changes, and the list it
names replaces the previous one (probing is `StaticSource`'s job)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from corral.router.membership import Membership
from corral.router.metrics import RouterMetrics
from corral.router.static_source import StaticSource

log = logging.getLogger("corral.router.file_source")


class BackendsFileError(Exception):
    """The backends file cannot be read or names something that is not an http(s) URL."""


def parse_backends(text: str, path: Path) -> list[str]:
    urls: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.startswith(("http://", "https://")):
            raise BackendsFileError(
                f"{path}:{number}: {line!r} is not an engine URL; write one http(s)://host:port per line"
            )
        urls.append(line.rstrip("/"))
    return urls


def read_backends(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise BackendsFileError(f"cannot read the backends file {path}: {exc.strerror or exc}") from None
    return parse_backends(text, path)


class FileSource:
    def __init__(
        self,
        membership: Membership,
        path: Path,
        refresh_seconds: float,
        probe_timeout: float,
        metrics: RouterMetrics | None = None,
        poll_seconds: float = 0.5,
    ) -> None:
        self._path = path
        self._poll_seconds = poll_seconds
        self._stamp = self._file_stamp()
        # A bad file at start is the user's to fix now; later, a bad edit keeps the last good list.
        self._static = StaticSource(
            membership, read_backends(path), refresh_seconds, probe_timeout, source="file", metrics=metrics
        )
        self._task: asyncio.Task[None] | None = None

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    async def start(self) -> None:
        await self._static.start()
        self._task = asyncio.create_task(self._watch(), name="corral-router-backends-file")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._static.stop()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            self.reload_if_changed()

    def reload_if_changed(self) -> bool:
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            urls = read_backends(self._path)
        except BackendsFileError as exc:
            log.error("%s; keeping the previous %d backends", exc, len(self._static.urls))
            return False
        log.info("backends file %s changed: %d backends", self._path, len(urls))
        self._static.set_urls(urls)
        return True
