"""The informer loop: list pods, then watch from the list's resourceVersion (with bookmarks); a
stream the server ended cleanly is watched again from the last version seen; a 410 Gone or a
broken stream leads to a re-list; and every `resync_seconds` a full re-list reconciles anyway,
which removes any pod whose DELETE event never arrived. The handler is called in order, on the
event loop, and must not wait: slow work belongs behind the keyed work queue.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from corral.k8s.watch.client import KubeApiError, PodApi, PodList, WatchEvent, WatchExpired

log = logging.getLogger("corral.router.k8s.informer")


class PodHandler(Protocol):
    def replace(self, listed: PodList) -> None:
        """The complete set of pods as of `listed.resource_version`; anything else is gone."""

    def apply(self, event: WatchEvent) -> None:
        """One ADDED, MODIFIED or DELETED event (bookmarks only move the version)."""


@dataclass(frozen=True, slots=True)
class InformerConfig:
    resync_seconds: float = 60.0
    watch_timeout_seconds: int = 300
    backoff_initial: float = 0.1
    backoff_max: float = 5.0


class PodInformer:
    def __init__(
        self,
        api: PodApi,
        handler: PodHandler,
        config: InformerConfig,
        on_relist: Callable[[str], None] = lambda why: None,
        on_event: Callable[[str], None] = lambda kind: None,
    ) -> None:
        self._api = api
        self._handler = handler
        self._config = config
        self._on_relist = on_relist
        self._on_event = on_event
        self.resource_version: str | None = None
        self.synced = asyncio.Event()  # set after the first successful list
        self.lists = 0

    async def run(self) -> None:
        """List and watch until cancelled; errors are logged and retried with backoff."""
        why = "initial"
        failures = 0
        while True:
            try:
                await self._list(why)
                failures = 0
                why = await self._watch_until_relist()
            except WatchExpired as exc:
                log.info("pod watch expired (%s); re-listing", exc)
                why = "expired"
            except KubeApiError as exc:
                failures += 1
                delay = self._backoff(failures)
                log.warning("pod list/watch failed (%s); re-listing in %.2f s", exc, delay)
                why = "broken"
                await asyncio.sleep(delay)

    def _backoff(self, failures: int) -> float:
        cap = min(self._config.backoff_max, self._config.backoff_initial * 2 ** (failures - 1))
        return random.uniform(cap / 2, cap)

    async def _list(self, why: str) -> None:
        listed = await self._api.list_pods()
        self.lists += 1
        self._on_relist(why)
        self._on_event("LISTED")
        self._handler.replace(listed)
        self.resource_version = listed.resource_version
        self.synced.set()
        log.info("listed %d pods at resourceVersion %s (%s)", len(listed.items), listed.resource_version, why)

    async def _watch_until_relist(self) -> str:
        """Watch from the current version until a resync is due; returns why to re-list.

        Raises WatchExpired on 410 and KubeApiError on a broken stream.
        """
        deadline = time.monotonic() + self._config.resync_seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "resync"
            assert self.resource_version is not None
            timeout = max(1, min(self._config.watch_timeout_seconds, int(remaining + 0.999)))
            try:
                async with asyncio.timeout(remaining):
                    async for event in self._api.watch_pods(self.resource_version, timeout):
                        self._on_event(event.type)
                        if event.type != "BOOKMARK":
                            self._handler.apply(event)
                        self.resource_version = event.resource_version
            except TimeoutError:
                return "resync"
            # A clean end (the server's timeoutSeconds): watch again from where we are.
