"""Requests whose framing the router refuses, and whose connection it ends, on both server sides:
CONNECT, and a transfer coding other than `chunked`.

The router never opens a tunnel. llhttp (aiohttp's parser and the lean server's) reads every byte after
a CONNECT head as the tunnel's, not as a body; once the tunnel is declined, aiohttp parses those bytes
as new requests. A CONNECT whose declared body is a request would then have that hidden request served
(issue 27), so the answer to a CONNECT is 400 with `Connection: close`, and nothing after its head is
ever parsed: aiohttp closes after the answer, and the lean server (corral.router.serving.connection)
hands aiohttp the head alone and drops what follows.

A transfer coding the router does not decode (`gzip, chunked`, `deflate`, ...) is refused (RFC 9112 §6.1:
a server SHOULD answer 501; the router answers 400 and closes, as for every framing it will not read).
llhttp reads the chunks of `gzip, chunked` and ignores the gzip, so the engine would be sent bytes
framed otherwise than the client meant, and an intermediary that reads the coding differently would
see other requests in them. No OpenAI client sends a transfer coding but `chunked`; vLLM's own server
(h11) refuses the others too. The lean server refuses the same heads (corral.router.serving.wire).
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


def coding_refusal(transfer_encoding: str, http_10: bool = False) -> str | None:
    """Why a request with this Transfer-Encoding is refused, or None when it is exactly `chunked` on
    HTTP/1.1 (on HTTP/1.0 its framing is faulty, RFC 9112 §6.1)."""
    if http_10:
        return "Transfer-Encoding is not allowed before HTTP/1.1"
    if transfer_encoding.strip().lower() == "chunked":
        return None
    return (
        f"Transfer-Encoding {transfer_encoding[:64]!r} is not supported: the router reads only `chunked`. "
        "Send the body with Content-Length or `Transfer-Encoding: chunked`."
    )


@web.middleware
async def refuse_framing(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The first middleware: a CONNECT, or a transfer coding other than chunked, is answered 400 and
    its connection closed after the answer (aiohttp parses nothing after it)."""
    coding = request.headers.get("Transfer-Encoding")
    if request.method != TUNNEL_METHOD and coding is None:
        return await handler(request)
    if request.method == TUNNEL_METHOD:
        why: str | None = REFUSAL
    else:  # aiohttp's parser refuses TE on HTTP/1.0, but not on an upgrade request
        why = coding_refusal(coding or "", request.version < (1, 1))
    if why is None:
        return await handler(request)
    refused = error_response(400, why, "BadRequestError")
    refused.force_close()
    return refused
