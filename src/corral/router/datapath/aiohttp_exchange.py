"""The data path's request and reply (corral.router.datapath.exchange) over aiohttp's server."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from corral.router.datapath.exchange import Answer, Headers
from corral.router.edge.tenants import Tenant, tenant_of


class AiohttpRequest:
    __slots__ = ("_request",)

    def __init__(self, request: web.Request) -> None:
        self._request = request

    @property
    def method(self) -> str:
        return self._request.method

    @property
    def path(self) -> str:
        return self._request.path

    @property
    def raw_path(self) -> str:
        return self._request.raw_path

    @property
    def headers(self) -> Mapping[str, str]:
        return self._request.headers

    @property
    def tenant(self) -> Tenant | None:
        return tenant_of(self._request)

    async def read(self) -> bytes:
        return await self._request.read()


class AiohttpReply:
    """Collects the answer as the aiohttp response the handler returns."""

    __slots__ = ("_request", "response")

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response: web.StreamResponse | None = None

    async def send(self, answer: Answer) -> None:
        self.response = web.Response(status=answer.status, body=answer.body, headers=answer.headers)

    async def start(self, status: int, headers: Headers) -> None:
        response = self.response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(self._request)

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self.response.write(chunk)

    async def finish(self) -> None:
        assert self.response is not None
        await self.response.write_eof()
