"""The HTTP surface of the simulator: vLLM's OpenAI-compatible routes and its operational endpoints.

Every answer carries `x-request-id` (the client's, echoed, or a fresh one); with a client id the response
id becomes `chatcmpl-<id>` / `cmpl-<id>`, as vLLM does with `--enable-request-id-headers`. Unknown paths get
FastAPI's `{"detail": "Not Found"}`. Routes of optional features (development endpoints, LoRA updating) are
added by their own modules when enabled, as vLLM only mounts them then.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Sequence
from typing import Any, Protocol

import orjson
from aiohttp import web

from corral.engine.sim_chat import render_chat
from corral.openai_errors import error_response, sse_error_event
from corral.sim.core.config import SimConfig
from corral.sim.core.engine import Engine, Job
from corral.sim.core.faults import Fault
from corral.sim.core.kv_transfer import KvLoadFailed
from corral.sim.core.lora import LoraAdapter, LoraRegistry
from corral.sim.core.requests import InferenceRequest, RequestError
from corral.sim.http.auth import ApiKeyGuard
from corral.sim.http.connections import BusyConnections
from corral.sim.http.metrics import CONTENT_TYPE, MetricsEndpoint
from corral.sim.http.protocol import parse_chat, parse_completion, parse_json
from corral.sim.http.responses import (
    DONE,
    PromptCache,
    StreamEncoder,
    chat_completion,
    model_list,
    text_completion,
)

# str(EngineDeadError()) in vLLM: what a request gets once the engine core is dead.
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# str(GenerationError()) in vLLM: what a request whose output finished with "error" gets (a failed KV load).
GENERATION_ERROR = "Internal server error"
_JSON = "application/json"
_SSE = "text/event-stream; charset=utf-8"
_ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/models": ("GET",),
    "/health": ("GET",),
    "/ping": ("GET", "POST"),
    "/version": ("GET",),
    "/load": ("GET",),
    "/metrics": ("GET",),
    "/tokenize": ("POST",),
    "/detokenize": ("POST",),
}


class RouteSet(Protocol):
    """An optional group of routes (the development endpoints, the LoRA endpoints)."""

    def add_routes(self, app: web.Application) -> None: ...


def _json(payload: Any, headers: dict[str, str], status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type=_JSON, headers=headers)


class SimApi:
    """Route handlers bound to one engine."""

    def __init__(
        self,
        config: SimConfig,
        engine: Engine,
        metrics: MetricsEndpoint,
        lora: LoraRegistry | None = None,
        addons: Sequence[tuple[RouteSet, dict[str, tuple[str, ...]]]] = (),
    ) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics
        self.lora = lora
        self.addons = addons
        self._routes = dict(_ROUTES)
        for _, routes in addons:
            self._routes.update(routes)
        self.created = int(time.time())
        self.fingerprint = "vllm-{}-{}".format(
            config.version_string, hashlib.sha1(f"{config.model}:{config.seed}".encode()).hexdigest()[:8]
        )
        self._models_version = -1
        self._models_body = b""
        self.connections = BusyConnections()

    def build(self) -> web.Application:
        guards = [ApiKeyGuard(self.config.api_keys).middleware] if self.config.api_keys else []
        middlewares = [self.connections.middleware, *guards]
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models, allow_head=False)
        r.add_get("/health", self.health, allow_head=False)
        r.add_get("/ping", self.health, allow_head=False)
        r.add_post("/ping", self.health)
        r.add_get("/version", self.version, allow_head=False)
        r.add_get("/load", self.load, allow_head=False)
        r.add_get("/metrics", self.prometheus, allow_head=False)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        for routes, _ in self.addons:
            routes.add_routes(app)
        r.add_route("*", "/{tail:.*}", self.not_found)
        return app

    @staticmethod
    def _ids(request: web.Request) -> dict[str, str]:
        return {"x-request-id": request.headers.get("x-request-id") or secrets.token_hex(16)}

    def _check_model(self, model: str | None) -> LoraAdapter | None:
        """None for the base model; the adapter a LoRA name stands for; 404 for anything else."""
        if model is None or model == self.config.model_name:
            return None
        if self.lora is not None:
            adapter = self.lora.get(model)
            if adapter is not None:
                return adapter
        raise RequestError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {self.config.model_name}.",
            "NotFoundError",
            "model",
        )

    # -- inference -------------------------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, chat=False)

    async def _inference(self, request: web.Request, chat: bool) -> web.StreamResponse:
        headers = self._ids(request)
        rid = headers["x-request-id"]
        engine = self.engine
        try:
            body = parse_json(await request.read())
            r = parse_chat(body) if chat else parse_completion(body)
            adapter = self._check_model(r.model)
            job = engine.prepare(r, rid, asyncio.get_running_loop().time(), adapter)
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type, exc.param, headers)
        if self.config.render_ms_per_token:  # in the API server: no engine gauge counts it yet
            await asyncio.sleep(job.req.prompt_len * self.config.render_ms_per_token / 1000.0)
        if engine.dead:
            return self._engine_dead(headers)
        if engine.rejecting:
            return error_response(
                503,
                "The engine is paused (POST /pause) and takes no new requests; retry after it resumes.",
                "ServiceUnavailableError",
                None,
                headers,
            )
        fault = engine.faults.next()
        if fault is Fault.CRASH:
            engine.crash()
        if fault is Fault.GPU:
            engine.die_of_gpu_fault()
        if fault is Fault.FAIL:
            engine.stats.success["error"] += 1  # as vLLM counts a request its engine failed
            return error_response(
                500,
                "EngineCore failed to process the request (simulated by --fail-rate).",
                "InternalServerError",
                None,
                headers,
            )
        if fault is Fault.WRONG:
            return self._wrong_answer(chat, rid, headers)
        job.hang = fault is Fault.HANG
        resp_id = ("chatcmpl-" if chat else "cmpl-") + rid
        created = int(time.time())
        engine.inflight += 1
        try:
            model = self.config.model_name if adapter is None else adapter.name
            if r.stream:
                return await self._stream(request, r, job, resp_id, created, headers, model)
            try:
                await engine.complete(job)
            except KvLoadFailed:
                return error_response(500, GENERATION_ERROR, "InternalServerError", None, headers)
            if engine.dead:
                return self._engine_dead(headers)
            build = chat_completion if chat else text_completion
            payload = build(
                resp_id,
                created,
                model,
                self.fingerprint,
                job.text,
                job.finish_reason,
                job.stop_reason,
                job.req.prompt_len,
                job.emitted,
                job.remote_params,
                self._prompt_cache(job),
            )
            return web.Response(body=payload, content_type=_JSON, headers=headers)
        finally:
            engine.inflight -= 1

    def _wrong_answer(self, chat: bool, rid: str, headers: dict[str, str]) -> web.Response:
        """`--wrong-answer`: a 200 whose body is no completion of this model."""
        kind = self.config.wrong_answer
        body: dict[str, Any]
        if kind == "error-body":
            message = "simulated (--wrong-answer error-body)"
            body = {"error": {"message": message, "type": "Error", "code": 500}}
        else:
            body = {
                "id": ("chatcmpl-" if chat else "cmpl-") + rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": "some-other-model" if kind == "other-model" else self.config.model_name,
                "choices": []
                if kind == "no-choices"
                else [{"index": 0, "text": " hi", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        return web.Response(body=orjson.dumps(body), content_type=_JSON, headers=headers)

    def _prompt_cache(self, job: Job) -> PromptCache | None:
        """`prompt_tokens_details`' figures with --enable-prompt-tokens-details (a miss included)."""
        if not self.config.enable_prompt_tokens_details:
            return None
        return PromptCache(job.cached, job.created_cache_tokens(self.config.block_size))

    async def _stream(
        self,
        request: web.Request,
        r: InferenceRequest,
        job: Job,
        resp_id: str,
        created: int,
        headers: dict[str, str],
        model: str,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": _SSE, **headers})
        plan = job.plan
        enc = StreamEncoder(r.chat, resp_id, created, model, self.fingerprint)
        try:
            await resp.prepare(request)
            # vLLM sends the chat role event with the engine's first output, not before prefill: a hung
            # engine core answers headers and then nothing, which a router may still retry elsewhere
            role_due = r.chat
            n = plan.num_tokens
            i = 0
            try:
                async with contextlib.aclosing(self.engine.stream(job)) as tokens:
                    async for delta in tokens:
                        i += 1
                        if role_due:
                            await resp.write(enc.role())
                            role_due = False
                        if i < n:
                            await resp.write(enc.delta(delta))
                        else:
                            await resp.write(
                                enc.last(
                                    delta,
                                    plan.finish_reason,
                                    plan.stop_reason,
                                    with_fingerprint=not r.include_usage,
                                )
                            )
            except KvLoadFailed:
                # its KV load failed before any token; vLLM sends a chat stream's role with that output
                if role_due:
                    await resp.write(enc.role())
                await resp.write(sse_error_event(GENERATION_ERROR, "InternalServerError", 500))
                await resp.write_eof()
                return resp
            if self.engine.dead:
                await resp.write(sse_error_event(ENGINE_DEAD_MESSAGE, "InternalServerError", 500))
                await resp.write_eof()
                return resp
            if job.aborted:
                if role_due:
                    await resp.write(enc.role())
                await resp.write(enc.last("", "abort", None, with_fingerprint=not r.include_usage))
            if r.include_usage:
                await resp.write(enc.usage(job.req.prompt_len, job.emitted, self._prompt_cache(job)))
            await resp.write(DONE)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away; the engine side was released by aclosing
        return resp

    # -- operational endpoints -------------------------------------------------------------------------

    def _model_list(self) -> bytes:
        version = self.lora.version if self.lora is not None else 0
        if version != self._models_version:
            adapters = list(self.lora.adapters.values()) if self.lora is not None else []
            self._models_body = model_list(
                self.config.model_name,
                self.config.model,
                self.created,
                self.config.max_model_len,
                "modelperm-" + secrets.token_hex(8),
                [
                    (a.name, a.path, a.base_model, a.created, "modelperm-" + secrets.token_hex(8))
                    for a in adapters
                ],
            )
            self._models_version = version
        return self._models_body

    async def models(self, request: web.Request) -> web.Response:
        return web.Response(body=self._model_list(), content_type=_JSON, headers=self._ids(request))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.engine.dead else 200, headers=self._ids(request))

    @staticmethod
    def _engine_dead(headers: dict[str, str]) -> web.Response:
        return error_response(500, ENGINE_DEAD_MESSAGE, "InternalServerError", None, headers)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": self.config.version_string}, self._ids(request))

    async def load(self, request: web.Request) -> web.Response:
        return _json({"server_load": self.engine.inflight}, self._ids(request))

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE, **self._ids(request)}
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        headers = self._ids(request)
        try:
            body = parse_json(await request.read())
            model_field = body.get("model")
            self._check_model(model_field if isinstance(model_field, str) else None)
            if isinstance(body.get("messages"), list):
                text = render_chat(body["messages"], body.get("add_generation_prompt", True) is not False)
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise RequestError(
                    400,
                    "1 validation error:\n  {'type': 'missing', 'loc': 'body.prompt', "
                    f"'msg': 'Field required', 'input': '<dict of {len(body)} items>'}}",
                    "Bad Request",
                    "body.prompt",
                )
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type, exc.param, headers)
        ids = self.engine.tokenizer.encode(text)
        strs = self.engine.tokenizer.token_strs(ids) if body.get("return_token_strs") else None
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.config.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            },
            headers,
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        headers = self._ids(request)
        try:
            body = parse_json(await request.read())
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise RequestError(
                    400,
                    "1 validation error:\n  {'type': 'list_type', 'loc': 'body.tokens', "
                    "'msg': 'Input should be a valid list of integers'}",
                    "Bad Request",
                    "body.tokens",
                )
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type, exc.param, headers)
        return _json({"prompt": self.engine.tokenizer.decode(tokens)}, headers)

    async def not_found(self, request: web.Request) -> web.Response:
        allowed = self._routes.get(request.path)
        if allowed is not None and request.method not in allowed:
            return _json({"detail": "Method Not Allowed"}, self._ids(request), status=405)
        return _json({"detail": "Not Found"}, self._ids(request), status=404)
