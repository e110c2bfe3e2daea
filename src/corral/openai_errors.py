"""The OpenAI/vLLM error body shape, shared by the simulator and the router.

vLLM answers every error as ``{"error": {"message", "type", "param", "code"}}``; clients
(the OpenAI SDK among them) parse that shape, so everything Corral serves uses it too.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> bytes:
    payload: dict[str, Any] = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return orjson.dumps(payload)


def error_response(
    status: int,
    message: str,
    err_type: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(message, err_type, status, param),
        content_type="application/json",
        headers=headers,
    )


def sse_error_event(message: str, err_type: str, code: int) -> bytes:
    """An in-stream error event followed by the terminator, as vLLM ends a failed stream."""
    return b"data: " + error_body(message, err_type, code) + b"\n\ndata: [DONE]\n\n"
