"""The simulator's `--api-key` guard, as vLLM's authentication middleware behaves.

With keys configured (`--api-key`, repeatable, or else `VLLM_API_KEY`), a request whose path starts with
`/v1` needs `Authorization: Bearer <one of the keys>`; without it the answer is 401 `{"error":
"Unauthorized"}`. Every other path (`/health`, `/metrics`, `/sleep`, ...) and every OPTIONS request stays
open. Only SHA-256 digests of the keys are held, compared in constant time.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable, Sequence

import orjson
from aiohttp import web

_GUARDED_PREFIX = "/v1"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiKeyGuard:
    """An aiohttp middleware that answers 401 to unauthenticated `/v1...` requests."""

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("ApiKeyGuard needs at least one key; without keys install no guard")
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    def admits(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, param = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode("utf-8", "surrogateescape")).digest()
        match = False
        for known in self._digests:
            match |= secrets.compare_digest(digest, known)
        return match

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method != "OPTIONS"
            and request.path.startswith(_GUARDED_PREFIX)
            and not self.admits(request.headers.get("Authorization"))
        ):
            headers = {"x-request-id": request.headers.get("x-request-id") or secrets.token_hex(16)}
            return web.Response(
                status=401,
                body=orjson.dumps({"error": "Unauthorized"}),
                content_type="application/json",
                headers=headers,
            )
        return await handler(request)
