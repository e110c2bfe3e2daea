"""Readiness that is earned by asking the engine: `/health` 200, `/v1/models` lists the expected model,
and a deterministic smoke completion (max_tokens ≤ 4, temperature 0) is a real completion of the model
(`smoke_answer.py`), asked only once every worker rank the command asks for has been seen and lives
(`ranks`, the supervisor's rank watch). `/health` alone proves nothing: vLLM answers 200 while
sleeping, paused or with a hung engine core, and a rank never seen may not have joined at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from corral.contracts.traffic import TrafficFigures
from corral.engine.load_sample import MetricsUnavailable
from corral.engine.traffic_source import fetch_traffic, first_request_ttft_s
from corral.supervisor.checks.smoke_answer import NotACompletion, completion_of

SMOKE_PROMPT = "The capital of France is"
SMOKE_MAX_TOKENS = 4


class NotReady(Exception):
    """One check failed; `check` names it (health, models, ranks, smoke) and the message says what was
    seen."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check}: {message}")
        self.check = check


class EngineNotAnswering(NotReady):
    """No HTTP answer at all: vLLM does not serve until the model is loaded, so during startup this
    means "still loading", not failure."""


@dataclass(frozen=True)
class SmokeResult:
    """`warmup_ttft_ms`: the TTFT the engine measured for this smoke when it was the first request
    since a start or a wake (`first_smoke`), kept apart from any steady-state figure."""

    model: str
    text: str
    completion_tokens: int | None
    warmup_ttft_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "text": self.text,
            "completion_tokens": self.completion_tokens,
        }
        if self.warmup_ttft_ms is not None:
            body["warmup_ttft_ms"] = self.warmup_ttft_ms
        return body


RanksMissing = Callable[[], str | None]  # None: every rank seen and alive; else which is not


class ReadinessCheck:
    """The checks against one engine URL; `model` None means the first model the engine lists;
    `ranks` says what keeps the engine's ranks from being whole (None: nothing to check)."""

    def __init__(
        self,
        engine_url: str,
        model: str | None,
        timeout: float = 10.0,
        ranks: RanksMissing | None = None,
    ) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.ranks = ranks

    def require_ranks(self) -> None:
        """NotReady("ranks") while a rank the command asks for is not seen, gone or lost."""
        missing = self.ranks() if self.ranks is not None else None
        if missing is not None:
            raise NotReady("ranks", missing)

    async def _get(self, session: aiohttp.ClientSession, path: str, check: str) -> aiohttp.ClientResponse:
        try:
            resp = await session.get(
                self.engine_url + path, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise EngineNotAnswering(check, f"GET {path}: {type(exc).__name__}: {exc}") from exc
        return resp

    async def health(self, session: aiohttp.ClientSession) -> None:
        resp = await self._get(session, "/health", "health")
        async with resp:
            if resp.status != 200:
                raise NotReady("health", f"GET /health answered HTTP {resp.status}")

    async def served_model(self, session: aiohttp.ClientSession) -> str:
        resp = await self._get(session, "/v1/models", "models")
        async with resp:
            if resp.status != 200:
                raise NotReady("models", f"GET /v1/models answered HTTP {resp.status}")
            try:
                body = orjson.loads(await resp.read())
                ids = [str(m["id"]) for m in body["data"]]
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise NotReady("models", f"GET /v1/models: unexpected body ({exc})") from exc
        if self.model is None:
            if not ids:
                raise NotReady("models", "GET /v1/models lists no model")
            return ids[0]
        if self.model not in ids:
            raise NotReady("models", f"GET /v1/models lists {ids}, not the expected {self.model!r}")
        return self.model

    async def smoke(
        self, session: aiohttp.ClientSession, model: str, within: float | None = None
    ) -> SmokeResult:
        payload = {
            "model": model,
            "prompt": SMOKE_PROMPT,
            "max_tokens": SMOKE_MAX_TOKENS,
            "temperature": 0,
            "stream": False,
        }
        try:
            async with session.post(
                self.engine_url + "/v1/completions",
                data=orjson.dumps(payload),
                headers={"content-type": "application/json", "x-request-id": "corral-smoke"},
                timeout=aiohttp.ClientTimeout(total=within or self.timeout),
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise NotReady("smoke", f"completion answered HTTP {resp.status}: {raw[:200]!r}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NotReady("smoke", f"completion failed: {type(exc).__name__}: {exc}") from exc
        try:
            text, tokens = completion_of(raw, model)
        except NotACompletion as exc:
            raise NotReady("smoke", str(exc)) from exc
        return SmokeResult(model, text, tokens)

    async def first_smoke(self, session: aiohttp.ClientSession, model: str) -> SmokeResult:
        """The smoke as the first request since a start or a wake, with its warmup TTFT: the growth of
        the engine's TTFT histogram sum across it (None when its /metrics cannot tell). Asked only of
        an engine whose ranks are whole: READY (after a start or a wake) needs every rank."""
        self.require_ranks()
        before = await self._traffic(session)
        smoke = await self.smoke(session, model)
        after = await self._traffic(session) if before is not None else None
        seconds = first_request_ttft_s(before, after) if before is not None and after is not None else None
        return smoke if seconds is None else replace(smoke, warmup_ttft_ms=round(seconds * 1000.0, 3))

    async def _traffic(self, session: aiohttp.ClientSession) -> TrafficFigures | None:
        try:
            return await fetch_traffic(session, self.engine_url, self.timeout)
        except MetricsUnavailable:
            return None

    async def earn(self, session: aiohttp.ClientSession) -> SmokeResult:
        """All three checks in order; raises NotReady naming the first that fails."""
        await self.health(session)
        model = await self.served_model(session)
        return await self.smoke(session, model)
