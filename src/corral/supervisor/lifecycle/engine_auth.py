"""The engine's own API key as the supervisor meets it: found by vLLM's rule (the last `--api-key` in the
engine command, else VLLM_API_KEY in the engine's environment), sent as `Authorization: Bearer` on every
request the supervisor makes to the engine's origin and to no other (dependency gates, the preload
daemon), and masked wherever the command or the engine's own output is shown or recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
from yarl import URL

API_KEY_FLAG = "--api-key"
API_KEY_ENV = "VLLM_API_KEY"
MASK = "<redacted>"


def _values_after(argv: Sequence[str], i: int) -> list[str]:
    """The arguments that follow a bare `--api-key` at index `i`, up to the next option."""
    values: list[str] = []
    for arg in argv[i + 1 :]:
        if arg.startswith("-") and values:
            break
        values.append(arg)
        if arg.startswith("-"):  # a key may begin with "-" only as the flag's first value
            break
    return values


def _flag_values(argv: Sequence[str]) -> list[str] | None:
    """The values of the last `--api-key` (vLLM keeps the last occurrence); None when it is absent."""
    found: list[str] | None = None
    for i, arg in enumerate(argv):
        if arg == API_KEY_FLAG:
            found = _values_after(argv, i)
        elif arg.startswith(API_KEY_FLAG + "="):
            found = [arg.partition("=")[2]]
    return found


def engine_api_key(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The key the engine demands, or None when it demands none. As vLLM: a given `--api-key` wins over
    VLLM_API_KEY even when empty, and an empty key guards nothing."""
    values = _flag_values(argv)
    chosen = values if values is not None else [environ.get(API_KEY_ENV, "")]
    return next((key for key in chosen if key), None)


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
