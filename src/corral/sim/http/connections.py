"""Which connections carry a request right now, as the simulator's own middleware counts them, so a
stopping simulator closes only idle keep-alive connections (uvicorn's behaviour) without reading
aiohttp's private state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BusyConnections:
    """A middleware (install it outermost) that marks a connection busy from the request's arrival until
    its answer is written out, the same span aiohttp's own in-progress flag covers."""

    def __init__(self) -> None:
        self._busy: dict[object, int] = {}  # the connection (its aiohttp protocol) -> requests in it

    def carries_request(self, connection: object) -> bool:
        return connection in self._busy

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = request.protocol
        self._busy[connection] = self._busy.get(connection, 0) + 1
        try:
            try:
                answer = await handler(request)
            except web.HTTPException as exc:
                await _write_out(request, exc)
                raise
            await _write_out(request, answer)
            return answer
        finally:
            left = self._busy[connection] - 1
            if left:
                self._busy[connection] = left
            else:
                del self._busy[connection]


async def _write_out(request: web.Request, answer: web.StreamResponse) -> None:
    """Send the answer now, before the connection counts as idle again (aiohttp then finds it sent)."""
    if not answer.prepared:
        await answer.prepare(request)
        await answer.write_eof()
