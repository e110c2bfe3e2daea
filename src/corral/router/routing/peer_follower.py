"""Following the router's peer replicas (`--peer URL`): one poller per peer asks for the picks it made
since the last page (`GET /internal/peer-picks?after=CURSOR`, every `POLL_SECONDS`, at once while
the peer says more wait) and applies each as a sibling worker's pick is applied
(`worker_journal.apply_pick`): the prompt's prefix keys learnt for the endpoint, a recent pick of the
policy that made it. Only picks of endpoints in this router's membership are applied; the rest are
counted and dropped. With `--workers N`, worker 1 follows the peers and relays what it applied through
the host's journals, so its siblings apply it too and the peers are asked once per host.

A peer is input from another host: a page is read with a size bound and no decompression, checked
whole (`peer_wire.decode_page`) and refused on any fault; a peer that fails, is slow or answers
garbage is asked again after a back-off (`BACKOFF_FIRST` doubling to `BACKOFF_CAP`), and never holds
up a request: routing only reads what a poller already applied. A peer whose incarnation changed (it
restarted) is read again from its start; one that answers with this router's own incarnation is this
router (every replica given one list of all their URLs) and is no longer asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.peer_wire import (
    MAX_PAGE_BYTES,
    PEER_PICKS_PATH,
    PeerPage,
    PeerPick,
    PeerWireError,
    decode_page,
    parse_cursor,
)
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import Policy
from corral.router.routing.worker_journal import WorkerSync, apply_pick

log = logging.getLogger("corral.router.peers")

POLL_SECONDS = 0.1
POLL_TIMEOUT_SECONDS = 1.0  # the whole exchange: connect, answer, body
BACKOFF_FIRST = 0.2
BACKOFF_CAP = 5.0
APPLY_BATCH = 64  # picks applied between two yields to the event loop


class PeerFollower:
    """One peer: its cursor, its state, and the picks of it applied here."""

    def __init__(
        self,
        url: str,
        token: str,
        lookup: Callable[[str], Endpoint | None],
        memory: PrefixMemory,
        policies: Mapping[str, Policy],
        sync: WorkerSync,
        relay: bool,
        own_incarnation: str = "",
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}
        self.lookup = lookup  # url -> the endpoint this router's membership holds now
        self.memory = memory
        self.policies = policies
        self.sync = sync
        self.relay = relay  # --workers N: write what is applied for the siblings
        self.incarnation: str | None = None
        self.cursor = ""
        self.up = False
        self.applied = 0  # picks applied
        self.ignored = 0  # picks of endpoints this router does not have
        self.failures = 0  # polls that failed or were refused, in all
        self.failing = 0  # ... in a row now
        self.last_error: str | None = None
        self.restarts = 0  # new incarnations seen after the first
        # this router's own life: a --peer URL that is this router itself (one list of every replica,
        # given to each) answers with it, and is no longer asked
        self.own_incarnation = own_incarnation
        self.itself = False
        # Reading a peer's backlog (first contact, its restart): its picks are history, not recent
        # picks — counted as recent now they would make the engines it used look busy for minutes
        # (the recent picks' half-life) — so only their keys are learnt, until a page that is not full.
        self.catching_up = True

    # -- one poll ------------------------------------------------------------------------------

    async def fetch(self, session: aiohttp.ClientSession) -> PeerPage:
        """The peer's next page; `PeerWireError` for any fault of the peer's (or of the way to it)."""
        try:
            async with session.get(
                self.url + PEER_PICKS_PATH,
                params={"after": self.cursor},
                headers=self._headers,
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    hint = " (the peers' --peer-token-file differ)" if resp.status in (401, 403) else ""
                    raise PeerWireError(f"answered {resp.status}{hint}")
                declared = resp.content_length
                if declared is not None and declared > MAX_PAGE_BYTES:
                    raise PeerWireError(f"page of {declared} bytes, over the {MAX_PAGE_BYTES} allowed")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(65536):
                    body += chunk
                    if len(body) > MAX_PAGE_BYTES:
                        raise PeerWireError(f"page over the {MAX_PAGE_BYTES} bytes allowed")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise PeerWireError(f"unreachable: {type(exc).__name__} {str(exc)[:200]}") from None
        return decode_page(bytes(body))

    async def take(self, page: PeerPage) -> bool:
        """Apply `page`; whether it is to be followed at once by the next (the peer has more)."""
        if page.incarnation == self.own_incarnation:
            self.itself = True
            log.info("peer %s is this router itself: not followed", self.url)
            return False
        if page.incarnation != self.incarnation:
            first = self.incarnation is None
            self.incarnation = page.incarnation
            if not first:  # the page answered a cursor of the peer's earlier life: read it from the start
                self.restarts += 1
                self.cursor = ""
                self.catching_up = True
                log.info(
                    "peer %s restarted (incarnation %s): reading its picks from the start",
                    self.url,
                    page.incarnation,
                )
                return True
        else:
            old, new = parse_cursor(self.cursor), parse_cursor(page.cursor)
            if len(new) == len(old) and any(b < a for a, b in zip(old, new, strict=True)):
                # a cursor going backwards in one life: the peer lost its journals; take what it says
                log.warning("peer %s went back in its picks (%s -> %s)", self.url, self.cursor, page.cursor)
        picks = page.picks
        for start in range(0, len(picks), APPLY_BATCH):
            self.apply(picks[start : start + APPLY_BATCH])
            if start + APPLY_BATCH < len(picks):
                await asyncio.sleep(0)  # a page of many picks never holds the loop for long
        self.cursor = page.cursor
        if not page.more:
            self.catching_up = False
        return page.more

    def apply(self, picks: Sequence[PeerPick]) -> None:
        now = time.monotonic()
        for pick in picks:
            endpoint = self.lookup(pick.url)
            if endpoint is None:
                self.ignored += 1
                continue
            # the keys hold for the prefix cache the peer saw: another epoch here, and they do not
            keys = pick.keys if pick.epoch_hash == self.sync.epoch_hash(endpoint) else ()
            policy = None if self.catching_up else self.policies.get(pick.policy)
            apply_pick(self.memory, endpoint, keys, policy, now)
            if self.relay:
                self.sync.relay(policy, endpoint, keys)
            self.applied += 1

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, session: aiohttp.ClientSession) -> None:
        backoff = BACKOFF_FIRST
        while True:
            try:
                page = await self.fetch(session)
            except PeerWireError as exc:
                self._failed(str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
                continue
            try:
                more = await self.take(page)
            except PeerWireError as exc:
                self._failed(str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
                continue
            if self.itself:
                return
            backoff = BACKOFF_FIRST
            if not self.up:
                self.up = True
                log.info("peer %s: following its picks", self.url)
            self.failing = 0
            await asyncio.sleep(0 if more else POLL_SECONDS)

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.failing += 1
        self.last_error = why
        if self.up or self.failing == 1:  # once per outage, not once per poll
            log.warning("peer %s: %s; asking again with back-off", self.url, why)
        self.up = False

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "up": self.up,
            "incarnation": self.incarnation,
            "applied": self.applied,
            "ignored": self.ignored,
            "failures": self.failures,
            "restarts": self.restarts,
            "itself": self.itself,
            "last_error": self.last_error,
        }


class PeerFollowers:
    """Every peer's follower, started and stopped with the app."""

    def __init__(self, followers: Sequence[PeerFollower]) -> None:
        self.followers = list(followers)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if not self.followers:
            return
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=POLL_TIMEOUT_SECONDS),
            auto_decompress=False,  # a compressed page is refused, not inflated
            connector=aiohttp.TCPConnector(limit_per_host=1),
        )
        session = self._session
        self._tasks = [asyncio.create_task(f.run(session)) for f in self.followers]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.followers]
