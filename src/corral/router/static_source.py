"""Membership from a fixed list of backend URLs: each becomes READY once its /v1/models answers.

A background task asks every backend concurrently, with a timeout, at start and then every
`refresh_seconds`; the answers update what each endpoint serves. Nothing here runs on the
request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from corral.router.endpoint import Endpoint, EngineState
from corral.router.membership import Membership

log = logging.getLogger("corral.router.static_source")


class ModelsProbeError(Exception):
    """A backend's /v1/models did not give a usable answer."""


def parse_model_cards(body: bytes) -> tuple[dict[str, Any], ...]:
    """The `data` entries of a vLLM /v1/models answer; raises ModelsProbeError on any other shape."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ModelsProbeError(f"/v1/models answered non-JSON: {exc}") from None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ModelsProbeError("/v1/models answered without a `data` list")
    cards = tuple(c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str))
    if not cards:
        raise ModelsProbeError("/v1/models lists no model")
    return cards


class StaticSource:
    def __init__(
        self,
        membership: Membership,
        urls: Sequence[str],
        refresh_seconds: float,
        probe_timeout: float = 2.0,
    ) -> None:
        self._membership = membership
        self._urls = [u.rstrip("/") for u in urls]
        self._refresh_seconds = refresh_seconds
        self._probe_timeout = probe_timeout
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        for url in self._urls:
            membership.add(Endpoint(url, reason="static backend, waiting for /v1/models"), "static list")

    async def start(self) -> None:
        """Open the probe session and start refreshing; the first round runs in the background."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._probe_timeout),
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
        )
        self._task = asyncio.create_task(self._run(), name="corral-router-static-source")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._refresh_seconds)

    async def refresh(self) -> None:
        """Ask every backend once, concurrently."""
        await asyncio.gather(*(self._probe(url) for url in self._urls))

    async def _probe(self, url: str) -> None:
        assert self._session is not None
        try:
            async with self._session.get(url + "/v1/models") as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise ModelsProbeError(f"GET /v1/models answered {resp.status}")
            cards = parse_model_cards(body)
        except (aiohttp.ClientError, TimeoutError, ModelsProbeError) as exc:
            self._probe_failed(url, describe(exc))
            return
        models = frozenset(c["id"] for c in cards)
        self._membership.update(
            url, "GET /v1/models answered", state=EngineState.READY, models=models, model_cards=cards
        )

    def _probe_failed(self, url: str, why: str) -> None:
        endpoint = self._membership.get(url)
        if endpoint is None:
            return
        if endpoint.state is EngineState.STARTING:
            self._membership.update(url, f"waiting for /v1/models: {why}")
        else:
            self._membership.update(url, f"/v1/models probe failed: {why}", state=EngineState.FAILED)


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
