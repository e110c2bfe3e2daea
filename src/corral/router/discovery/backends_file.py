"""Membership from a backends file (`--backends-file`): one engine per line, `#` comments; a line is
an engine URL, or `ENGINE_URL=SUPERVISOR_URL` for an engine run under `corral supervise` (routed only
while its supervisor says READY, each removal confirmed, as with `--supervised`). A line may end in
`group=NAME/SIZE`: the engine is a member of serving group NAME of SIZE engines, routed to only while
the whole group is READY on one bundle fingerprint, and/or `role=prefill|decode|both`: the engine's
role in prefill/decode disaggregation (its supervisor's word, when it has one, wins), and/or
`kv_events=PUB[,REPLAY]`: where the engine publishes KV-cache events (`tcp://*:5557` on the engine's
host; its supervisor's word, when it has one, wins), and/or `name=NAME`: what people call the engine
(`engine-0`; shown in `/v1/fleet` and the dashboard). The file is
read again whenever its modification time, size or inode changes, and the list it names replaces the
previous one (probing is `StaticSource`'s job). This is how a fleet that Corral runs changes the
router's members at run time: write the new file atomically (temp file, then rename). A bad edit, or the
file gone, is logged and keeps the previous list (`corral.reloaded_file`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from corral.engine.kv_events_address import parse_address
from corral.engine.pd_protocol import ROLES
from corral.reloaded_file import ReloadedFile
from corral.router.discovery.static import StaticSource
from corral.router.membership.events import MembershipSink
from corral.router.membership.group_tag import GroupTag, GroupTagError, group_tag
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.file_source")


class BackendsFileError(Exception):
    """The backends file cannot be read or names something that is not an http(s) URL."""


_LINE = re.compile(r"^(https?://[^=\s]+?)/?(?:=(https?://\S+?)/?)?$")
_GROUP = re.compile(r"^group=([^/\s]*)/(\S*)$")
MARKERS = ("group=", "role=", "kv_events=", "name=")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Backends:
    """What a backends file names: engine URLs in file order, the supervisor of those that have one,
    the serving group of those in one, and the declared role of those that declare one."""

    urls: list[str]
    supervisors: dict[str, str]
    groups: dict[str, GroupTag] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    kv_events: dict[str, str] = field(default_factory=dict)  # where each engine publishes KV events
    names: dict[str, str] = field(default_factory=dict)  # what people call each engine that has a name


def parse_backends(text: str, path: Path) -> Backends:
    urls: list[str] = []
    supervisors: dict[str, str] = {}
    groups: dict[str, GroupTag] = {}
    roles: dict[str, str] = {}
    kv_events: dict[str, str] = {}
    names: dict[str, str] = {}
    counted: dict[str, list[int]] = {}  # group name -> the line numbers naming it
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        engine, *markers = line.split()
        match = _LINE.match(engine)
        if match is None or (markers and not markers[0].startswith(MARKERS)):
            raise BackendsFileError(
                f"{path}:{number}: {line!r} is not an engine; write one http(s)://host:port per line, "
                "or ENGINE_URL=SUPERVISOR_URL for a supervised engine, optionally followed by "
                "group=NAME/SIZE, role=prefill|decode|both, kv_events=PUB[,REPLAY] and name=NAME"
            )
        urls.append(match.group(1))
        if match.group(2):
            supervisors[match.group(1)] = match.group(2)
        role_markers = [m for m in markers if m.startswith("role=")]
        markers = [m for m in markers if not m.startswith("role=")]
        if role_markers:
            roles[match.group(1)] = _role_marker(role_markers, path, number)
        event_markers = [m for m in markers if m.startswith("kv_events=")]
        markers = [m for m in markers if not m.startswith("kv_events=")]
        if event_markers:
            kv_events[match.group(1)] = _kv_events_marker(event_markers, match.group(1), path, number)
        name_markers = [m for m in markers if m.startswith("name=")]
        markers = [m for m in markers if not m.startswith("name=")]
        if name_markers:
            names[match.group(1)] = _name_marker(name_markers, path, number)
        if markers:
            tag = _group_marker(markers, path, number)
            first = next((t for t in groups.values() if t.name == tag.name), None)
            if first is not None and first.size != tag.size:
                raise BackendsFileError(
                    f"{path}:{number}: group {tag.name} is given size {tag.size} here and {first.size} "
                    f"on line {counted[tag.name][0]}; give every member of a group the same size"
                )
            counted.setdefault(tag.name, []).append(number)
            if len(counted[tag.name]) > tag.size:
                raise BackendsFileError(
                    f"{path}:{number}: group {tag.name} of size {tag.size} has more members than that "
                    f"(lines {', '.join(map(str, counted[tag.name]))}); fix its size or its members"
                )
            groups[match.group(1)] = tag
    return Backends(urls, supervisors, groups, roles, kv_events, names)


def _name_marker(markers: list[str], path: Path, number: int) -> str:
    name = markers[0].removeprefix("name=")
    if len(markers) > 1 or _NAME.match(name) is None:
        raise BackendsFileError(
            f"{path}:{number}: {' '.join(markers)!r} is not a name marker; write one name=NAME with NAME of "
            "letters, digits, '.', '_' or '-' (at most 63, e.g. name=engine-0)"
        )
    return name


def _kv_events_marker(markers: list[str], engine: str, path: Path, number: int) -> str:
    text = markers[0].removeprefix("kv_events=")
    if len(markers) > 1:
        raise BackendsFileError(f"{path}:{number}: give one kv_events= marker, not {len(markers)}")
    try:
        parse_address(text, urlsplit(engine).hostname or "127.0.0.1")
    except ValueError as exc:
        raise BackendsFileError(f"{path}:{number}: kv_events={text}: {exc}") from None
    return text


def _role_marker(markers: list[str], path: Path, number: int) -> str:
    role = markers[0].removeprefix("role=")
    if len(markers) > 1 or role not in ROLES:
        raise BackendsFileError(
            f"{path}:{number}: {' '.join(markers)!r} is not a role marker; write one role=ROLE with ROLE "
            f"one of {', '.join(ROLES)} (e.g. role=prefill), or nothing for an engine that does both"
        )
    return role


def _group_marker(markers: list[str], path: Path, number: int) -> GroupTag:
    match = _GROUP.match(markers[0]) if len(markers) == 1 else None
    if match is None:
        raise BackendsFileError(
            f"{path}:{number}: {' '.join(markers)!r} after the engine is not a group marker; "
            "write group=NAME/SIZE (e.g. group=g0/2) or nothing"
        )
    try:
        return group_tag(match.group(1), match.group(2))
    except GroupTagError as exc:
        raise BackendsFileError(f"{path}:{number}: {exc}") from None


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
        self._file = ReloadedFile(
            path,
            read_backends,
            self._apply,
            self._refused,
            (BackendsFileError,),
            poll_seconds=poll_seconds,
            task_name="corral-router-backends-file",
        )
        # A bad file at start is the user's to fix now; later, a bad edit keeps the last good list.
        first = self._file.read_now()
        self._static = StaticSource(
            sink,
            first.urls,
            refresh_seconds,
            probe_timeout,
            source="file",
            metrics=metrics,
            supervisors=first.supervisors,
            groups=first.groups,
            roles=first.roles,
            kv_events=first.kv_events,
            names=first.names,
            probe_headers=probe_headers,
        )

    async def start(self) -> None:
        await self._static.start()
        await self._file.start()

    async def stop(self) -> None:
        await self._file.stop()
        await self._static.stop()

    def _refused(self, exc: Exception) -> None:
        log.error("%s; keeping the previous %d backends", exc, len(self._static.urls))

    def _apply(self, backends: Backends) -> None:
        log.info(
            "backends file %s changed: %d backends, %d supervised, %d in serving groups, %d with a role",
            self._file.path,
            len(backends.urls),
            len(backends.supervisors),
            len(backends.groups),
            len(backends.roles),
        )
        self._static.set_urls(
            backends.urls,
            backends.supervisors,
            backends.groups,
            backends.roles,
            backends.kv_events,
            backends.names,
        )
