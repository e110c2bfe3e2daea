"""CONNECT is refused and ends its connection, on both server sides.

The router never opens a tunnel. llhttp (aiohttp's parser and the lean server's) reads every byte after
a CONNECT head as the tunnel's, not as a body; once the tunnel is declined, aiohttp parses those bytes
as new requests. A CONNECT whose declared body is a request would then have that hidden request served
(issue 27), so the answer to a CONNECT is 400 with `Connection: close`, and nothing after its head is
ever parsed: aiohttp closes after the answer, and the lean server (corral.router.serving.connection)
hands aiohttp the head alone and drops what follows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from corral.openai_errors import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TUNNEL_METHOD = "CONNECT"
REFUSAL = (
    "CONNECT is not served: the router opens no tunnels. Send the request itself "
    "(for example POST /v1/chat/completions) to the router."
)


@web.middleware
async def refuse_tunnels(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The first middleware: a CONNECT is answered 400 and its connection closed after the answer."""
    if request.method != TUNNEL_METHOD:
        return await handler(request)
    refused = error_response(400, REFUSAL, "BadRequestError")
    refused.force_close()  # aiohttp parses nothing after it (it would: the declined tunnel's bytes)
    return refused
