"""One JSON call to one of Corral's own APIs, and the one error every client raises: the status (None
when nothing answered) and the server's own message, never a credential."""

from __future__ import annotations

from typing import Any, TypeVar

import aiohttp
import orjson
from pydantic import ValidationError

from corral.contracts.wire import WireModel, first_message

M = TypeVar("M", bound=WireModel)


class APIError(Exception):
    """A call to a Corral API that did not get the answer it wanted. `message` is what the server
    said (its error message, else the start of its body) or why nothing answered; `str()` adds where."""

    def __init__(self, where: str, status: int | None, message: str) -> None:
        said = f"HTTP {status}: {message}" if status is not None else message
        super().__init__(f"{where}: {said}")
        self.where = where
        self.status = status
        self.message = message

    @property
    def unreachable(self) -> bool:
        return self.status is None


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def server_message(body: bytes) -> str:
    """The server's `{"error": {"message": ...}}`, else the start of what it sent."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode(errors="replace")
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and error.get("message") is not None:
        return str(error["message"])[:1000]
    return str(parsed)[:300]


class JSONCaller:
    """Calls under one base URL with one set of headers, on a session the caller owns."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, token: str | None, name: str, timeout: float
    ) -> None:
        self._session = session
        self.url = url.rstrip("/")
        self.headers = bearer(token)
        self._name = name
        self._timeout = timeout

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}({self._name} {self.url})"

    def where(self, path: str) -> str:
        return f"{self._name} {self.url}{path}"

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        ok: tuple[int, ...] = (200,),
        within: float | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of an answer whose status is in `ok`; APIError otherwise."""
        sent = {**self.headers, **(headers or {})}
        data = None
        if body is not None:
            data = orjson.dumps(body)
            sent["Content-Type"] = "application/json"
        limit = aiohttp.ClientTimeout(total=within if within is not None else self._timeout)
        try:
            async with self._session.request(
                method, self.url + path, data=data, headers=sent, params=params, timeout=limit
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            why = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise APIError(self.where(path), None, f"unreachable ({why})") from None
        if status not in ok:
            raise APIError(self.where(path), status, server_message(raw))
        return status, raw

    def parse(self, model: type[M], path: str, status: int, raw: bytes) -> M:
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            raise APIError(
                self.where(path),
                status,
                f"answered a body that is not a {model.__name__}: {first_message(exc)}",
            ) from None
