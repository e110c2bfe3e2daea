"""`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (only with VLLM_ALLOW_RUNTIME_LORA_UPDATING).

As vLLM: the body must be `application/json` (else a 400 validation error), fields are checked like its
pydantic models, success is a 200 plain-text sentence, refusals are `{"error": ...}` with 400/404/500.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from corral.openai_errors import error_response
from corral.sim.core.logs import EngineLog
from corral.sim.core.lora import LoraRegistry
from corral.sim.core.requests import RequestError
from corral.sim.http.protocol import FieldChecker, parse_json

ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/load_lora_adapter": ("POST",),
    "/v1/unload_lora_adapter": ("POST",),
}


def _require_json(request: web.Request) -> None:
    if request.content_type.lower() != "application/json":
        raise RequestError(
            400,
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            "Bad Request",
        )


def _string(f: FieldChecker, name: str, required: bool) -> str:
    value = f.required(name) if required else f.body.get(name)
    if value is not None and not isinstance(value, str):
        f._err("string_type", name, "Input should be a valid string", value)
        return ""
    return value or ""


class LoraApi:
    def __init__(
        self,
        registry: LoraRegistry,
        log: EngineLog,
        on_change: Callable[[], None],
        on_load: Callable[[], None] = lambda: None,
    ) -> None:
        self.registry = registry
        self.log = log
        self._on_change = on_change
        self._on_load = on_load

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/unload_lora_adapter", self.unload)

    async def load(self, request: web.Request) -> web.Response:
        try:
            _require_json(request)
            body = parse_json(await request.read())
            f = FieldChecker(body)
            name = _string(f, "lora_name", True)
            path = _string(f, "lora_path", True)
            inplace = bool(f.bool_("load_inplace"))
            f.bool_("is_3d_lora_weight")
            f.raise_if_any()
            reloaded = name in self.registry.adapters
            message = self.registry.load(name, path, inplace)
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type, exc.param)
        if reloaded:
            self.log.warning(
                "APIServer",
                "serving.py:217",
                f"Reloaded LoRA adapter '{name}' in place from '{path}'.",
            )
        self.log.info("APIServer", "serving.py:226", f"Loaded new LoRA adapter: name '{name}', path '{path}'")
        self._on_load()
        self._on_change()
        return web.Response(text=message, content_type="text/plain")

    async def unload(self, request: web.Request) -> web.Response:
        try:
            _require_json(request)
            body = parse_json(await request.read())
            f = FieldChecker(body)
            name = _string(f, "lora_name", True)
            f.int_("lora_int_id")
            f.raise_if_any()
            message = self.registry.unload(name)
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.err_type, exc.param)
        self.log.info("APIServer", "serving.py:245", f"Removed LoRA adapter: name '{name}'")
        self._on_change()
        return web.Response(text=message, content_type="text/plain")
