"""The simulated KV side channel between a prefill and a decode engine: the prefill engine answers
`POST /_corral/kv/pull` on its own port (where vLLM's NIXL listens on VLLM_NIXL_SIDE_CHANNEL_PORT and the
decode engine reads GPU memory directly), and the decode engine pulls through it.

The body is `{"remote_request_id": ..., "blocks": N}` (the blocks the decode engine lacks); the answer
says `outcome` (ok | unknown | expired | failed) with the blocks and bytes moved. A private path: no
client of the OpenAI API ever calls it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web

from corral.sim.core.kv_transfer import KvTransfers, PullAnswer

PULL_PATH = "/_corral/kv/pull"
ROUTES: dict[str, tuple[str, ...]] = {PULL_PATH: ("POST",)}
_STATUS = {"ok": 200, "unknown": 404, "expired": 410, "failed": 500}


class KvSideChannel:
    """Serves pulls of the blocks this engine holds and runs this engine's pulls from others."""

    def __init__(self, kv: KvTransfers) -> None:
        self.kv = kv
        self._session: aiohttp.ClientSession | None = None
        kv.fetch = self.fetch

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(PULL_PATH, self.serve)
        app.on_cleanup.append(self._close)

    async def serve(self, request: web.Request) -> web.Response:
        try:
            body: Any = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        request_id = body.get("remote_request_id") if isinstance(body, dict) else None
        if not isinstance(request_id, str):
            return web.json_response(
                {"outcome": "bad_request", "detail": 'send {"remote_request_id": "<id>"}'}, status=400
            )
        wanted = body.get("blocks")
        answer = await self.kv.serve_pull(request_id, wanted if isinstance(wanted, int) else None)
        payload = {"outcome": answer.outcome, "blocks": answer.blocks, "bytes": answer.nbytes}
        return web.json_response(payload, status=_STATUS.get(answer.outcome, 500))

    async def fetch(self, host: str, port: int, request_id: str, blocks: int, timeout_s: int) -> PullAnswer:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"http://{host}:{port}{PULL_PATH}"
        try:
            async with self._session.post(
                url,
                json={"remote_request_id": request_id, "blocks": blocks},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return PullAnswer("unreachable")
        if not isinstance(body, dict):
            return PullAnswer("unreachable")
        return PullAnswer(str(body.get("outcome")), int(body.get("blocks") or 0), int(body.get("bytes") or 0))

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
