"""One request as the lean server holds it (corral.router.datapath.exchange's ClientRequest): its head,
and its body gathered as it arrives, read once whole."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from corral.router.datapath.exchange import Headers
from corral.router.edge.tenants import Tenant


class BodyTooLarge(Exception):
    """The body grew past --max-body-size while it arrived (chunked, or longer than declared)."""


class LeanRequest:
    __slots__ = (
        "_body",
        "_error",
        "_headers",
        "_size",
        "_waiter",
        "complete",
        "declared",
        "headers_list",
        "held",
        "keep_alive",
        "max_body",
        "method",
        "path",
        "raw_path",
        "tenant",
        "version",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        path: str,
        headers: Headers,
        version: str,
        keep_alive: bool,
        max_body: int,
    ) -> None:
        self.method = method
        self.raw_path = raw_path
        self.path = path
        self.headers_list = headers
        self._headers: CIMultiDictProxy[str] | None = None
        self.version = version
        self.keep_alive = keep_alive
        self.max_body = max_body
        self.tenant: Tenant | None = None
        self.declared: int | None = None
        self.held = 0  # its head's bytes, when it was parsed ahead of another request's answer
        self.complete = False
        self._body: list[bytes] = []
        self._size = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        if self._headers is None:
            self._headers = CIMultiDictProxy(CIMultiDict(self.headers_list))
        return self._headers

    # -- the body, fed by the connection ------------------------------------------------------

    @property
    def size(self) -> int:
        """The body's bytes received so far."""
        return self._size

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            return
        self._size += len(data)
        if self.max_body and self._size > self.max_body:
            self._body.clear()
            self.set_exception(BodyTooLarge())
            return
        self._body.append(data)

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        """End the read with `exc` (the connection guard's BodyReadTimeout, or BodyTooLarge)."""
        if self._error is None:
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # the connection guard watches `request.content` (is_eof, set_exception) as on aiohttp's requests
    @property
    def content(self) -> LeanRequest:
        return self

    def is_eof(self) -> bool:
        return self.complete or self._error is not None

    async def read(self) -> bytes:
        while not self.complete and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        body = self._body
        return body[0] if len(body) == 1 else b"".join(body)
