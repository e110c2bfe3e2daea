"""The client's side of one proxied exchange, whichever HTTP server carries it.

The data path (corral.router.datapath.proxy) reads a request through `ClientRequest` and answers
through `ClientReply`: a whole `Answer` (errors, non-streamed answers), or a status and headers
followed by chunks (SSE), each write waiting while the client's socket is full. aiohttp's server
(corral.router.datapath.aiohttp_exchange) and the router's lean HTTP/1.1 server
(corral.router.serving) each provide both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from corral.openai_errors import error_body

if TYPE_CHECKING:
    from corral.router.edge.tenants import Tenant

Headers = list[tuple[str, str]]

JSON = ("Content-Type", "application/json")


@dataclass(slots=True)
class Answer:
    """A whole answer: its status, its headers (Content-Length is the server's) and its body."""

    status: int
    body: bytes
    headers: Headers = field(default_factory=list)


def error_answer(
    status: int,
    message: str,
    err_type: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """An error in OpenAI's shape (corral.openai_errors), as an Answer."""
    extra = list(headers.items()) if headers else []
    return Answer(status, error_body(message, err_type, status, param), [JSON, *extra])


class ClientRequest(Protocol):
    """What the data path reads of the client's request."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str:
        """The decoded path, without the query."""

    @property
    def raw_path(self) -> str:
        """The request target as sent (path and query), forwarded upstream as is."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Case-insensitive; `items()` in the order sent, repeated names kept."""

    @property
    def tenant(self) -> Tenant | None:
        """The tenant the request was admitted as; None on an open router."""

    async def read(self) -> bytes:
        """The whole body (raises the server's own errors for a body too large or stalled)."""


class ClientReply(Protocol):
    """How the data path answers: `send` once, or `start`, `write`... and `finish`."""

    async def send(self, answer: Answer) -> None: ...

    async def start(self, status: int, headers: Headers) -> None: ...

    async def write(self, chunk: bytes) -> None:
        """Send a chunk of a started answer; waits while the client is slower than the engine."""

    async def finish(self) -> None: ...
