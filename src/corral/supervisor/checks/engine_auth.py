"""The engine's own API key as the supervisor meets it: found by vLLM's rule (the last `--api-key` in the
engine command, else VLLM_API_KEY in the engine's environment), sent as `Authorization: Bearer` on every
request the supervisor makes to the engine's origin and to no other (dependency gates, the preload
daemon), and masked wherever the command or the engine's own output is shown or recorded (with every
other secret of the one redaction list, `corral.redaction`).
"""

from __future__ import annotations

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
from yarl import URL


class EngineKey:
    """An aiohttp client middleware: requests to the engine's origin carry its key, others never do.

    `key` follows the engine that runs (a bundle switch may bring another key); a request that names
    its own Authorization keeps it.
    """

    def __init__(self, engine_url: str, key: str | None = None) -> None:
        self._origin = URL(engine_url).origin()
        self.key = key

    def __repr__(self) -> str:
        return f"EngineKey({str(self._origin)!r}, key={'set' if self.key else None})"

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if self.key and "Authorization" not in request.headers and request.url.origin() == self._origin:
            request.headers["Authorization"] = f"Bearer {self.key}"
        return await handler(request)
