"""`/metrics` and `/v1/fleet` of a router run with `--workers N`: whichever worker a request reaches
answers for all of them, reading its siblings' own views over their private Unix sockets.

/metrics: every worker's samples under a `worker` label, families merged, so one scrape of the port
sees every worker (`sum without (worker)` gives the router's totals) and `corral_router_worker_up` says
which answered. /v1/fleet: the answering worker's view (its membership, states and verdicts), with the
counters summed over the workers that answered (each endpoint's `in_flight`, `requests_sent` and
`traffic`, and `totals`), so a window read between two requests (`corral verify --observe-seconds`)
counts the router's traffic whichever worker each request reached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from corral.contracts.traffic import TrafficFigures

UP = "corral_router_worker_up"
_UP_HEAD = (
    f"# HELP {UP} 1 for each worker whose samples are on this page, 0 for one that did not answer "
    "(restarting).\n"
    f"# TYPE {UP} gauge\n"
)
_HEADER = (b"# HELP ", b"# TYPE ")


def label_page(page: bytes, worker: str) -> bytes:
    """Every sample line of a Prometheus text page with `worker="<worker>"` added to its labels."""
    label = f'worker="{worker}"'.encode()
    lines = page.split(b"\n")
    for i, line in enumerate(lines):
        if not line or line.startswith(b"#"):
            continue
        space = line.find(b" ")
        brace = line.find(b"{", 0, space)  # a metric name has neither: the first of them ends it
        if brace < 0:
            lines[i] = line[:space] + b"{" + label + b"}" + line[space:]
        elif line[brace + 1 : brace + 2] == b"}":
            lines[i] = line[: brace + 1] + label + line[brace + 1 :]
        else:
            lines[i] = line[: brace + 1] + label + b"," + line[brace + 1 :]
    return b"\n".join(lines)


def merge_pages(pages: Sequence[bytes]) -> bytes:
    """One page from several with the same families: each family's HELP and TYPE once (from the first
    page that has it), then its samples from every page in order, as the text format wants them."""
    families: dict[bytes, tuple[list[bytes], list[bytes]]] = {}
    for page in pages:
        new_here: set[bytes] = set()
        samples: list[bytes] | None = None
        for line in page.split(b"\n"):
            if line.startswith(_HEADER):
                name = line.split(b" ", 3)[2]
                family = families.get(name)
                if family is None:
                    family = families[name] = ([], [])
                    new_here.add(name)
                if name in new_here:
                    family[0].append(line)
                samples = family[1]
            elif line and not line.startswith(b"#") and samples is not None:
                samples.append(line)
    out = [line for head, samples in families.values() for line in (*head, *samples)]
    return b"\n".join(out) + b"\n"


def merge_fleets(own: dict[str, Any], others: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`own` (a worker's /v1/fleet body) with each endpoint's `in_flight`, `requests_sent` and `traffic`,
    and the `totals` and `model_requests`, summed with the same endpoint's in `others` (sibling workers'
    bodies)."""
    by_url = [{e["url"]: e for e in other.get("endpoints", ())} for other in others]
    for endpoint in own.get("endpoints", ()):
        theirs = [index[endpoint["url"]] for index in by_url if endpoint["url"] in index]
        for key in ("in_flight", "requests_sent"):
            endpoint[key] = endpoint.get(key, 0) + sum(e.get(key, 0) for e in theirs)
        figures = [e["traffic"] for e in (endpoint, *theirs) if e.get("traffic") is not None]
        if figures:
            total = TrafficFigures.model_validate(figures[0])
            for more in figures[1:]:
                total = total.plus(TrafficFigures.model_validate(more))
            endpoint["traffic"] = total.to_wire()
    totals = [body["totals"] for body in (own, *others) if body.get("totals") is not None]
    if totals:
        own["totals"] = {k: sum(t.get(k, 0) for t in totals) for k in totals[0]}
    counted: dict[str, dict[str, int]] = {}
    for body in (own, *others):
        for model, counts in (body.get("model_requests") or {}).items():
            each = counted.setdefault(model, {"requests": 0, "errors": 0})
            for key in each:
                each[key] += counts.get(key, 0)
    if counted:
        own["model_requests"] = counted
    return own


def _worker_order(name: str) -> tuple[int, str]:
    digits = name.lstrip("w")
    return (int(digits), name) if digits.isdigit() else (0, name)


class WorkerPages:
    """This worker's labelled page on its socket for its siblings, and the merged page for a scrape."""

    def __init__(
        self,
        name: str,
        own_page: Callable[[], bytes],
        own_fleet: Callable[[], dict[str, Any]],
        socket_path: Path,
        siblings: Mapping[str, Path],
        timeout: float = 2.0,
    ) -> None:
        self.name = name
        self._own_page = own_page
        self._own_fleet = own_fleet
        self._socket_path = socket_path
        self._siblings = dict(siblings)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None

    def labelled(self) -> bytes:
        return label_page(self._own_page(), self.name)

    async def start(self) -> None:
        async def own(request: web.BaseRequest) -> web.Response:
            if request.path == "/fleet":
                return web.Response(body=orjson.dumps(self._own_fleet()))
            return web.Response(body=self.labelled())

        with contextlib.suppress(FileNotFoundError):
            self._socket_path.unlink()  # left by this worker's previous process
        self._server = web.Server(own, access_log=None)
        self._listener = await asyncio.get_running_loop().create_unix_server(
            self._server, str(self._socket_path)
        )

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()
            self._listener = None
        if self._server is not None:
            await self._server.shutdown(1.0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self._socket_path.unlink()

    async def page(self) -> bytes:
        """Every worker's samples, merged; a sibling that does not answer in time is reported down."""
        names = sorted(self._siblings)
        read = await asyncio.gather(*(self._read(self._siblings[n], "/metrics") for n in names))
        pages = {self.name: self.labelled(), **dict(zip(names, read, strict=True))}
        ordered = sorted(pages.items(), key=lambda item: _worker_order(item[0]))
        up_lines = "".join(f'{UP}{{worker="{n}"}} {int(page is not None)}\n' for n, page in ordered)
        merged = merge_pages([page for _, page in ordered if page is not None])
        return merged + (_UP_HEAD + up_lines).encode()

    async def fleet(self) -> dict[str, Any]:
        """This worker's /v1/fleet with the counters of every sibling that answered added in."""
        names = sorted(self._siblings)
        read = await asyncio.gather(*(self._read(self._siblings[n], "/fleet") for n in names))
        others = [orjson.loads(body) for body in read if body is not None]
        body = merge_fleets(self._own_fleet(), others)
        answered = [n for n, page in zip(names, read, strict=True) if page is not None]
        body["worker"] = {
            **(body.get("worker") or {}),
            "counters_from": sorted([self.name, *answered], key=_worker_order),
        }
        return body

    async def _read(self, path: Path, what: str) -> bytes | None:
        try:
            connector = aiohttp.UnixConnector(path=str(path))
            async with (
                aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session,
                session.get("http://worker" + what) as resp,
            ):
                return await resp.read() if resp.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
