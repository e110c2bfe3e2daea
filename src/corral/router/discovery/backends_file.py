"""Membership from a backends file (`--backends-file`): one engine per line, `#` comments; a line is
an engine URL, or `ENGINE_URL=SUPERVISOR_URL` for an engine run under `corral supervise` (routed only
while its supervisor says READY, each removal confirmed, as with `--supervised`). The file is read
again whenever its modification time, size or inode changes, and the list it names replaces the
previous one (probing is `StaticSource`'s job). This is how a fleet that Corral runs changes the
router's members at run time: write the new file atomically (temp file, then rename)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from corral.aio import cancel_tasks
from corral.atomic_file import file_stamp
from corral.router.discovery.static import StaticSource
from corral.router.membership.events import MembershipSink
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.file_source")


class BackendsFileError(Exception):
    """The backends file cannot be read or names something that is not an http(s) URL."""


_LINE = re.compile(r"^(https?://[^=\s]+?)/?(?:=(https?://\S+?)/?)?$")


@dataclass(frozen=True, slots=True)
class Backends:
    """What a backends file names: engine URLs in file order, and the supervisor of those that have one."""

    urls: list[str]
    supervisors: dict[str, str]


def parse_backends(text: str, path: Path) -> Backends:
    urls: list[str] = []
    supervisors: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise BackendsFileError(
                f"{path}:{number}: {line!r} is not an engine; write one http(s)://host:port per line, "
                "or ENGINE_URL=SUPERVISOR_URL for a supervised engine"
            )
        urls.append(match.group(1))
        if match.group(2):
            supervisors[match.group(1)] = match.group(2)
    return Backends(urls, supervisors)


def read_backends(path: Path) -> Backends:
    try:
        text = path.read_text()
    except OSError as exc:
        raise BackendsFileError(f"cannot read the backends file {path}: {exc.strerror or exc}") from None
    return parse_backends(text, path)


class FileSource:
    def __init__(
        self,
        sink: MembershipSink,
        path: Path,
        refresh_seconds: float,
        probe_timeout: float,
        metrics: RouterMetrics | None = None,
        poll_seconds: float = 0.5,
        probe_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._path = path
        self._poll_seconds = poll_seconds
        self._stamp = self._file_stamp()
        # A bad file at start is the user's to fix now; later, a bad edit keeps the last good list.
        first = read_backends(path)
        self._static = StaticSource(
            sink,
            first.urls,
            refresh_seconds,
            probe_timeout,
            source="file",
            metrics=metrics,
            supervisors=first.supervisors,
            probe_headers=probe_headers,
        )
        self._task: asyncio.Task[None] | None = None

    def _file_stamp(self) -> tuple[int, int, int] | None:
        return file_stamp(self._path)

    async def start(self) -> None:
        await self._static.start()
        self._task = asyncio.create_task(self._watch(), name="corral-router-backends-file")

    async def stop(self) -> None:
        await cancel_tasks(self._task)
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
            backends = read_backends(self._path)
        except BackendsFileError as exc:
            log.error("%s; keeping the previous %d backends", exc, len(self._static.urls))
            return False
        log.info(
            "backends file %s changed: %d backends, %d supervised",
            self._path,
            len(backends.urls),
            len(backends.supervisors),
        )
        self._static.set_urls(backends.urls, backends.supervisors)
        return True
