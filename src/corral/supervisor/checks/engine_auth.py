"""The engine's own API key as the supervisor meets it: found by vLLM's rule (the last `--api-key` in the
engine command, else VLLM_API_KEY in the engine's environment), sent as `Authorization: Bearer` on every
request the supervisor makes to the engine's origin and to no other (dependency gates, the preload
daemon), and masked wherever the command or the engine's own output is shown or recorded.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
from yarl import URL

from corral.engine.flags import API_KEY_FLAG

MASK = "<redacted>"


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The command with every `--api-key` value masked: what logs, the oplog and `/v1/state` show."""
    shown: list[str] = []
    in_values = False  # among the values of a bare --api-key
    for arg in argv:
        if in_values and (shown[-1] == API_KEY_FLAG or not arg.startswith("-")):
            shown.append(MASK)
            continue
        in_values = arg == API_KEY_FLAG
        shown.append(API_KEY_FLAG + "=" + MASK if arg.startswith(API_KEY_FLAG + "=") else arg)
    return shown


class Redactor:
    """Masks known secrets in text (the engine's output lines echo its arguments, the key among them)."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._secrets = tuple(s for s in secrets if s)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text


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
