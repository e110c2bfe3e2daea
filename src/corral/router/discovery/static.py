"""Membership from a list of backend URLs (`--backend`, `--supervised`, or a backends file through
`FileSource`): each becomes READY once its /v1/models answers (and, for an engine with a supervisor,
once the supervisor's state stream says READY too). A backend may be declared a prefill or decode
engine (`--prefill`, `--decode`, a backends file's `role=`).

A background task asks every backend concurrently, with a timeout, at start and then every
`refresh_seconds` (a fleet too large for `PROBES_PER_SECOND` over a longer round, spread evenly); the
answers update what each endpoint serves, and its `/version` the P/D pairing identity
(`engine_identity`) that an engine without a supervisor has. Nothing here runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from corral.aio import cancel_tasks
from corral.engine.models_probe import PROBE_FAILURES, describe, probe_models
from corral.engine.page_get import PageClient
from corral.engine_state import EngineState
from corral.router.discovery.engine_identity import probe_pairing
from corral.router.membership.events import EndpointAdded, EndpointRemoved, EndpointUpdated, MembershipSink
from corral.router.membership.group_tag import GroupTag
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.static_source")

# Past PROBES_PER_SECOND x --models-refresh-seconds backends, each is asked less often than the refresh
# interval: the whole fleet at most this many probes a second, started a few at a time.
PROBES_PER_SECOND = 20
PROBES_PER_TICK = 5


class StaticSource:
    def __init__(
        self,
        sink: MembershipSink,
        urls: Sequence[str],
        refresh_seconds: float,
        probe_timeout: float = 2.0,
        source: str = "static",
        metrics: RouterMetrics | None = None,
        supervisors: Mapping[str, str] | None = None,
        probe_headers: Mapping[str, str] | None = None,
        groups: Mapping[str, GroupTag] | None = None,
        roles: Mapping[str, str] | None = None,
        kv_events: Mapping[str, str] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self._sink = sink
        # engine url -> what people call it (`engine-0`), for the engines given a name
        self._names = {k.rstrip("/"): v for k, v in (names or {}).items()}
        # engine url -> where it publishes KV-cache events (`PUB[,REPLAY]`), for the engines that say
        self._kv_events = {k.rstrip("/"): v for k, v in (kv_events or {}).items()}
        # engine url -> its declared role (prefill | decode | both), for the engines declared one
        self._roles = {k.rstrip("/"): v for k, v in (roles or {}).items()}
        self._answered: set[str] = set()  # urls whose /v1/models answered since they were added
        self._probe_headers = dict(probe_headers or {})  # the engine API key, when engines want one
        # engine url -> its supervisor's url, for the engines that have one
        self._supervisors = {k.rstrip("/"): v.rstrip("/") for k, v in (supervisors or {}).items()}
        # engine url -> its serving group, for the engines in one
        self._groups = {k.rstrip("/"): v for k, v in (groups or {}).items()}
        self._urls: list[str] = []
        self._refresh_seconds = refresh_seconds
        self._probe_timeout = probe_timeout
        self._source = source
        self._metrics = metrics
        self._probes: set[asyncio.Task[None]] = set()
        self._session: PageClient | None = None
        self._task: asyncio.Task[None] | None = None
        self.set_urls(urls)

    def set_urls(
        self,
        urls: Sequence[str],
        supervisors: Mapping[str, str] | None = None,
        groups: Mapping[str, GroupTag] | None = None,
        roles: Mapping[str, str] | None = None,
        kv_events: Mapping[str, str] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        """Make the list exactly `urls`: new ones are added (probed on the next round, or now when
        running), dropped ones removed from membership at once. With `supervisors` (engine url ->
        supervisor url) the supervised set is replaced too, and with `groups` (engine url -> serving
        group) the grouped set, and with `roles` the declared roles; an engine whose supervisor, group or
        role changed is removed and added again, so that its routing follows the new ones only."""
        wanted = list(dict.fromkeys(u.rstrip("/") for u in urls))
        moved: set[str] = set()
        if supervisors is not None:
            new = {k.rstrip("/"): v.rstrip("/") for k, v in supervisors.items()}
            moved = {u for u in self._urls if self._supervisors.get(u) != new.get(u)}
            self._supervisors = new
        if groups is not None:
            regrouped = {k.rstrip("/"): v for k, v in groups.items()}
            moved |= {u for u in self._urls if self._groups.get(u) != regrouped.get(u)}
            self._groups = regrouped
        if roles is not None:
            recast = {k.rstrip("/"): v for k, v in roles.items()}
            moved |= {u for u in self._urls if self._roles.get(u) != recast.get(u)}
            self._roles = recast
        if kv_events is not None:
            readdressed = {k.rstrip("/"): v for k, v in kv_events.items()}
            moved |= {u for u in self._urls if self._kv_events.get(u) != readdressed.get(u)}
            self._kv_events = readdressed
        if names is not None:
            renamed = {k.rstrip("/"): v for k, v in names.items()}
            moved |= {u for u in self._urls if self._names.get(u) != renamed.get(u)}
            self._names = renamed
        for url in self._urls:
            if url not in wanted or url in moved:
                self._count(url, "DELETED")
                why = (
                    "its supervisor, group or role changed"
                    if url in wanted
                    else f"no longer in the {self._source} list"
                )
                self._answered.discard(url)
                self._sink.emit(EndpointRemoved(url, why, cause=f"{self._source}_removed"))
        kept = [u for u in self._urls if u in wanted and u not in moved]
        fresh = [u for u in wanted if u not in kept]
        for url in fresh:
            self._count(url, "ADDED")
            supervisor = self._supervisors.get(url)
            self._sink.emit(
                EndpointAdded(
                    identity=url,  # a listed backend is nothing but its address
                    url=url,
                    source=self._source,
                    reason=f"{self._source} backend, waiting for /v1/models",
                    origin=f"{self._source} list",
                    supervisor_url=supervisor,
                    group=self._groups.get(url),
                    role=self._roles.get(url),
                    kv_events=self._kv_events.get(url),
                    name=self._names.get(url),
                )
            )
        self._urls = wanted
        if fresh and self._session is not None:
            for url in fresh:
                task = asyncio.create_task(self._probe(url), name=f"corral-router-probe-{url}")
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)

    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    def _count(self, url: str, kind: str) -> None:
        if self._metrics is not None:
            self._metrics.count_event(self._source, kind)

    async def start(self) -> None:
        """Open the probe session and start refreshing; the first round runs in the background."""
        self._session = PageClient(self._probe_timeout, keepalive=0.0)  # each engine asked once a round
        self._task = asyncio.create_task(self._run(), name="corral-router-static-source")

    async def stop(self) -> None:
        await cancel_tasks(self._task)
        self._task = None
        for task in list(self._probes):
            task.cancel()
        if self._probes:
            await asyncio.gather(*self._probes, return_exceptions=True)
        if self._session is not None:
            self._session.close()
            self._session = None

    async def _run(self) -> None:
        await self.refresh()  # the first round at once: every backend becomes READY as soon as it can
        while True:
            await asyncio.sleep(self._refresh_seconds)
            if len(self._urls) <= PROBES_PER_SECOND * self._refresh_seconds:
                await self.refresh()
                continue
            # A large fleet: one round over every backend, its probes spread evenly at the budget's
            # pace (1,000 backends are not asked in one burst, nor more than PROBES_PER_SECOND a second).
            urls = list(self._urls)
            step = 1.0 / PROBES_PER_SECOND
            for start in range(0, len(urls), PROBES_PER_TICK):
                for url in urls[start : start + PROBES_PER_TICK]:
                    task = asyncio.create_task(self._probe(url), name=f"corral-router-probe-{url}")
                    self._probes.add(task)
                    task.add_done_callback(self._probes.discard)
                await asyncio.sleep(step * PROBES_PER_TICK)

    async def refresh(self) -> None:
        """Ask every backend once, concurrently."""
        await asyncio.gather(*(self._probe(url) for url in self._urls))

    async def _probe(self, url: str) -> None:
        if self._session is None:
            return
        try:
            cards = await probe_models(self._session, url, self._probe_headers)
        except PROBE_FAILURES as exc:
            self._probe_failed(url, describe(exc))
            return
        models = frozenset(c["id"] for c in cards)
        # asked before READY is emitted, so that an endpoint is never routable without the identity;
        # only in a P/D fleet (a role declared): an aggregated fleet's engines get no extra request
        pairing = None
        if any(role in ("prefill", "decode") for role in self._roles.values()):
            pairing = await probe_pairing(self._session, url, cards, self._probe_headers)
        if url not in self._urls:
            return  # dropped from the list while the probe ran
        self._answered.add(url)
        self._sink.emit(
            EndpointUpdated(
                url,
                "GET /v1/models answered",
                state=EngineState.READY,
                models=models,
                model_cards=cards,
                pairing=pairing,
            )
        )

    def _probe_failed(self, url: str, why: str) -> None:
        if url not in self._urls:
            return
        if url not in self._answered:
            self._sink.emit(EndpointUpdated(url, f"waiting for /v1/models: {why}"))
        else:
            self._sink.emit(
                EndpointUpdated(
                    url, f"/v1/models probe failed: {why}", state=EngineState.FAILED, cause="probe_failed"
                )
            )
