"""vLLM's development endpoints (only with `VLLM_SERVER_DEV_MODE=1`): sleep/wake, pause/resume, KV release,
collective RPC, prefix-cache reset, request abort and `/server_info`.

Status codes and bodies as vLLM's FastAPI routes give them: a bad query value is a 400 validation error
(`type: "Bad Request"`, `param: "query.<name>"`), an engine-core refusal is a 500 `InternalServerError`
whose message is `Call to <method> method failed: ...`, a malformed `collective_rpc` / `abort_requests`
body is a 400 with the route's own message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from corral.openai_errors import error_response
from corral.sim.core.config import SimConfig
from corral.sim.core.control import EngineControl
from corral.sim.core.lifecycle import LifecycleError, worker_failure
from corral.sim.core.logs import EngineLog
from corral.sim.core.requests import RequestError
from corral.sim.http.protocol import validation_error

_JSON = "application/json"
RankLine = Callable[[int, str, str, str], None]  # (rank, level, where, message)
PAUSE_MODES = ("abort", "wait", "keep")
ROUTES: dict[str, tuple[str, ...]] = {
    "/sleep": ("POST",),
    "/wake_up": ("POST",),
    "/is_sleeping": ("GET",),
    "/release_kv_cache_memory": ("POST",),
    "/collective_rpc": ("POST",),
    "/pause": ("POST",),
    "/resume": ("POST",),
    "/is_paused": ("GET",),
    "/reset_prefix_cache": ("POST",),
    "/abort_requests": ("POST",),
    "/server_info": ("GET",),
}


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type=_JSON)


def _query_error(
    kind: str, name: str, msg: str, value: str, ctx: dict[str, Any] | None = None
) -> RequestError:
    err: dict[str, Any] = {"type": kind, "loc": f"query.{name}", "msg": msg, "input": value}
    if ctx is not None:
        err["ctx"] = ctx
    return validation_error([err])


def query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _query_error(
            "int_parsing", name, "Input should be a valid integer, unable to parse string as an integer", raw
        ) from None
    if value < lo:
        raise _query_error(
            "greater_than_equal", name, f"Input should be greater than or equal to {lo}", raw, {"ge": lo}
        )
    if value > hi:
        raise _query_error(
            "less_than_equal", name, f"Input should be less than or equal to {hi}", raw, {"le": hi}
        )
    return value


def query_choice(request: web.Request, name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw not in choices:
        expected = ", ".join(f"'{c}'" for c in choices[:-1]) + f" or '{choices[-1]}'"
        raise _query_error("literal_error", name, f"Input should be {expected}", raw, {"expected": expected})
    return raw


def query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "t", "yes", "y", "on"):
        return True
    if value in ("0", "false", "f", "no", "n", "off"):
        return False
    raise _query_error(
        "bool_parsing", name, "Input should be a valid boolean, unable to interpret input", raw
    )


def _http_error(status: int, detail: str) -> web.Response:
    """FastAPI's HTTPException as vLLM renders it: the status phrase as the error type."""
    phrase = {400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}[status]
    return error_response(status, detail, phrase, None)


class DevApi:
    """The development routes of one engine."""

    def __init__(
        self,
        config: SimConfig,
        control: EngineControl,
        log: EngineLog,
        reload_seconds: float = 0.0,
        load_info: Callable[[], dict[str, Any]] = dict,
        rank_line: RankLine | None = None,
    ) -> None:
        self.config = config
        self.control = control
        self.log = log
        self.reload_seconds = reload_seconds
        self._load_info = load_info
        self._rank_line = rank_line  # logs a line as one worker rank (the executor's), if any

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/sleep", self.sleep)
        r.add_post("/wake_up", self.wake_up)
        r.add_get("/is_sleeping", self.is_sleeping, allow_head=False)
        r.add_post("/release_kv_cache_memory", self.release_kv_cache_memory)
        r.add_post("/collective_rpc", self.collective_rpc)
        r.add_post("/pause", self.pause)
        r.add_post("/resume", self.resume)
        r.add_get("/is_paused", self.is_paused, allow_head=False)
        r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        r.add_post("/abort_requests", self.abort_requests)
        r.add_get("/server_info", self.server_info, allow_head=False)

    @staticmethod
    def _failed(exc: LifecycleError | RequestError) -> web.Response:
        if isinstance(exc, RequestError):
            return error_response(exc.status, exc.message, exc.err_type, exc.param)
        return error_response(500, str(exc), "InternalServerError", None)

    # -- sleep -----------------------------------------------------------------------------------------

    async def sleep(self, request: web.Request) -> web.Response:
        try:
            level = query_int(request, "level", 1, 0, 2)
            mode = query_choice(request, "mode", "abort", PAUSE_MODES)
        except RequestError as exc:
            return self._failed(exc)
        if self.config.fail_sleep and level >= 1:
            # vLLM pauses the scheduler before the executor sleeps; the worker's failure leaves it paused.
            await self.control.pause(mode, clear_cache=True)
            return error_response(
                500,
                worker_failure(
                    "sleep", "CUDA error: an illegal memory access was encountered (simulated: --fail-sleep)"
                ),
                "InternalServerError",
                None,
            )
        await self.control.sleep(level, mode)
        return _json({"status": "sleeping", "level": level})

    async def wake_up(self, request: web.Request) -> web.Response:
        tags: list[str] | None = request.query.getall("tags", []) or None
        failing = self._injected_wake_failure(tags)
        if failing is not None:
            return error_response(
                500,
                worker_failure(
                    "wake_up", f"CUDA out of memory re-allocating {failing} (simulated: --fail-wake-tag)"
                ),
                "InternalServerError",
                None,
            )
        fully_awake = self.control.wake_up(tags)
        return _json({"status": "awake" if fully_awake else "sleeping", "tags": tags})

    def _injected_wake_failure(self, tags: list[str] | None) -> str | None:
        asleep = self.control.lifecycle.sleeping_tags
        for tag in self.config.fail_wake_tags:
            if tag in asleep and (tags is None or tag in tags):
                return tag
        return None

    async def is_sleeping(self, _request: web.Request) -> web.Response:
        return _json({"is_sleeping": self.control.lifecycle.is_sleeping})

    async def release_kv_cache_memory(self, _request: web.Request) -> web.Response:
        try:
            self.control.release_kv_cache()
        except LifecycleError as exc:
            self.log.error(
                "EngineCore", "core.py:1750", "Invocation of release_kv_cache_memory method failed"
            )
            return self._failed(exc)
        return _json({"status": "kv_cache_released"})

    # -- collective RPC --------------------------------------------------------------------------------

    async def _json_body(self, request: web.Request, bad_json: str) -> dict[str, Any] | web.Response:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # The route parses with the standard library; its message is what vLLM answers.
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return _http_error(400, bad_json.format(exc))
        if not isinstance(body, dict):
            return _http_error(400, "Request body must be a JSON object")
        return body

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await self._json_body(request, "JSON decode error: {}")
        if isinstance(body, web.Response):
            return body
        method = body.get("method")
        if method is None:
            return _http_error(400, "Missing 'method' in request body")
        if method != "reload_weights":
            return error_response(
                500,
                worker_failure("collective_rpc", f"'Worker' object has no attribute {method!r}"),
                "InternalServerError",
                None,
            )
        try:
            await self.control.reload_weights(self.reload_seconds)
        except LifecycleError as exc:
            return self._failed(exc)
        ranks = self.config.tensor_parallel_size
        failing = self.config.fail_reload_rank
        if failing is not None and failing < ranks:
            return self._reload_failed_in(failing)
        # vLLM's executor answers one result per worker, in rank order; reload_weights returns None
        return _json({"results": [None] * ranks})

    def _reload_failed_in(self, rank: int) -> web.Response:
        """`--fail-reload-rank`: as vLLM fails a collective RPC that raised in one rank. With worker
        processes (TP ≥ 2) that worker logs the exception under its own name (vLLM's WorkerProc) and the
        executor's error, which names no rank, comes back as the engine core's 500; with one rank the
        worker runs in the engine core, which logs the failed invocation and answers the bare error."""
        error = (
            "RuntimeError: Error(s) in loading state_dict: size mismatch for "
            f"model.layers.0.mlp.down_proj.weight (simulated: --fail-reload-rank {rank})"
        )
        if self.config.tensor_parallel_size == 1:
            self.log.error("EngineCore_DP0", "core.py:1150", "Invocation of collective_rpc method failed")
            self.log.error("EngineCore_DP0", "core.py:1150", error)
            message = f"Call to collective_rpc method failed: {error}"
            return error_response(500, message, "InternalServerError", None)
        if self._rank_line is not None:
            self._rank_line(rank, "ERROR", "multiproc_executor.py:816", "WorkerProc hit an exception.")
            self._rank_line(rank, "ERROR", "multiproc_executor.py:816", error)
        return error_response(500, worker_failure("collective_rpc", error), "InternalServerError", None)

    # -- pause -----------------------------------------------------------------------------------------

    async def pause(self, request: web.Request) -> web.Response:
        try:
            mode = query_choice(request, "mode", "abort", PAUSE_MODES)
            clear_cache = query_bool(request, "clear_cache", True)
        except RequestError as exc:
            return self._failed(exc)
        await self.control.pause(mode, clear_cache, reject_new=True)
        return _json({"status": "paused"})

    async def resume(self, _request: web.Request) -> web.Response:
        self.control.resume()
        return _json({"status": "resumed"})

    async def is_paused(self, _request: web.Request) -> web.Response:
        return _json({"is_paused": self.control.lifecycle.is_paused})

    # -- caches and requests ---------------------------------------------------------------------------

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        try:
            reset_running = query_bool(request, "reset_running_requests", False)
            query_bool(request, "reset_external", False)
        except RequestError as exc:
            return self._failed(exc)
        return _json({"success": self.control.reset_prefix_cache(reset_running)})

    async def abort_requests(self, request: web.Request) -> web.Response:
        body = await self._json_body(request, "Invalid JSON format")
        if isinstance(body, web.Response):
            return body
        ids = body.get("request_ids")
        if ids:
            wanted = {str(i) for i in ids}
            # vLLM's external ids are the response ids (`chatcmpl-<x-request-id>`); accept either form.
            wanted |= {i.split("-", 1)[1] for i in wanted if i.startswith(("chatcmpl-", "cmpl-"))}
            self.control.abort(wanted)
            return _json({"status": "aborted", "aborted": len(ids)})
        return _json({"status": "aborted", "aborted": self.control.abort(None)})

    async def server_info(self, _request: web.Request) -> web.Response:
        cfg = self.config
        env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_") and "KEY" not in k}
        return _json(
            {
                "vllm_config": (
                    f"model='{cfg.model}', max_seq_len={cfg.max_model_len}, "
                    f"enable_sleep_mode={cfg.enable_sleep_mode}, load_format={cfg.load_format}, "
                    f"enable_lora={cfg.enable_lora}, max_loras={cfg.max_loras}"
                ),
                "vllm_env": env,
                "system_env": {"simulated": True},
                "corral_sim": {**self.control.lifecycle.snapshot(), "weight_load": self._load_info()},
            }
        )
