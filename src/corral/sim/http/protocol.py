"""Request bodies of the OpenAI endpoints, checked the way vLLM (FastAPI + pydantic) checks them.

Bad JSON and ill-typed or missing fields become 400 `type: "Bad Request"` with a pydantic-style message and
`param: "body.<field>"`; semantic problems (stream_options without stream, ...) become `BadRequestError`
with `(parameter=..., value=...)` in the message, as in the captured samples.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from corral.engine.sim_chat import render_chat
from corral.sim.core.requests import InferenceRequest, RequestError


def _shown(value: Any) -> Any:
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return value


def _validation_error(errors: list[dict[str, Any]]) -> RequestError:
    plural = "s" if len(errors) > 1 else ""
    lines = "\n".join(f"  {e}" for e in errors)
    return RequestError(
        400, f"{len(errors)} validation error{plural}:\n{lines}", "Bad Request", str(errors[0]["loc"])
    )


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or the validation error FastAPI gives for it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson's messages differ from the stdlib's, which is what FastAPI reports.
        try:
            json.loads(raw)
            msg, pos = "JSON decode error", 0
        except json.JSONDecodeError as exc:
            msg, pos = exc.msg, exc.pos
        except UnicodeDecodeError:
            msg, pos = "Invalid UTF-8", 0
        raise _validation_error(
            [
                {
                    "type": "json_invalid",
                    "loc": f"body.{pos}",
                    "msg": "JSON decode error",
                    "input": "<dict of 0 items>",
                    "ctx": {"error": msg},
                }
            ]
        ) from None
    if not isinstance(body, dict):
        raise _validation_error(
            [
                {
                    "type": "model_attributes_type",
                    "loc": "body",
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": _shown(body),
                }
            ]
        )
    return body


class _Fields:
    """Pydantic-like lax checks of top-level fields, collecting every error like pydantic does."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.errors: list[dict[str, Any]] = []

    def _err(self, kind: str, field: str, msg: str, value: Any) -> None:
        self.errors.append({"type": kind, "loc": f"body.{field}", "msg": msg, "input": _shown(value)})

    def required(self, field: str) -> Any:
        if field not in self.body:
            self.errors.append(
                {
                    "type": "missing",
                    "loc": f"body.{field}",
                    "msg": "Field required",
                    "input": _shown(self.body),
                }
            )
            return None
        return self.body[field]

    def int_(self, field: str) -> int | None:
        v = self.body.get(field)
        if v is None:
            return None
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str):
            try:
                return int(v.strip())
            except ValueError:
                self._err(
                    "int_parsing",
                    field,
                    "Input should be a valid integer, unable to parse string as an integer",
                    v,
                )
                return None
        self._err("int_type", field, "Input should be a valid integer", v)
        return None

    def float_(self, field: str) -> float | None:
        v = self.body.get(field)
        if v is None:
            return None
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v.strip())
            except ValueError:
                self._err(
                    "float_parsing",
                    field,
                    "Input should be a valid number, unable to parse string as a number",
                    v,
                )
                return None
        self._err("float_type", field, "Input should be a valid number", v)
        return None

    def bool_(self, field: str) -> bool | None:
        v = self.body.get(field)
        if v is None or isinstance(v, bool):
            return v
        if v in (0, 1):
            return bool(v)
        if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            return v.lower() in ("true", "yes", "on", "1")
        self._err(
            "bool_parsing" if isinstance(v, str) else "bool_type",
            field,
            "Input should be a valid boolean" + (", unable to interpret input" if isinstance(v, str) else ""),
            v,
        )
        return None

    def dict_(self, field: str) -> dict[str, Any] | None:
        v = self.body.get(field)
        if v is None or isinstance(v, dict):
            return v
        self._err("dict_type", field, "Input should be a valid dictionary", v)
        return None

    def stop(self) -> tuple[str, ...]:
        v = self.body.get("stop")
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return tuple(v)
        self._err("string_type", "stop", "Input should be a valid string", v)
        return ()

    def raise_if_any(self) -> None:
        if self.errors:
            raise _validation_error(self.errors)


def _sampling(
    f: _Fields, max_tokens_fields: tuple[str, ...]
) -> tuple[int | None, float, int | None, tuple[str, ...], bool, bool]:
    max_tokens = None
    for name in max_tokens_fields:
        value = f.int_(name)
        if value is not None and max_tokens is None:
            max_tokens = value
    temperature = f.float_("temperature")
    seed = f.int_("seed")
    stop = f.stop()
    stream = bool(f.bool_("stream"))
    stream_options = f.dict_("stream_options")
    f.int_("n")
    f.raise_if_any()
    if stream_options is not None and not stream:
        raise RequestError(
            400,
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "BadRequestError",
            "stream_options",
        )
    include_usage = bool(stream_options and stream_options.get("include_usage"))
    return max_tokens, 1.0 if temperature is None else temperature, seed, stop, stream, include_usage


def _model(f: _Fields) -> str | None:
    v = f.body.get("model")
    if v is not None and not isinstance(v, str):
        f._err("string_type", "model", "Input should be a valid string", v)
        return None
    return v


def parse_chat(body: dict[str, Any]) -> InferenceRequest:
    f = _Fields(body)
    messages = f.required("messages")
    if messages is not None and not isinstance(messages, list):
        f._err("list_type", "messages", "Input should be a valid list", messages)
    elif isinstance(messages, list):
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                f._err(
                    "model_attributes_type",
                    f"messages.{i}",
                    "Input should be a valid dictionary or object to extract fields from",
                    m,
                )
            elif "role" not in m:
                f._err("missing", f"messages.{i}.role", "Field required", m)
    model = _model(f)
    transfer_params = f.dict_("kv_transfer_params")
    max_tokens, temperature, seed, stop, stream, include_usage = _sampling(
        f, ("max_completion_tokens", "max_tokens")
    )
    add_generation_prompt = body.get("add_generation_prompt", True) is not False
    return InferenceRequest(
        True,
        model,
        render_chat(messages, add_generation_prompt),
        None,
        max_tokens,
        temperature,
        seed,
        stop,
        stream,
        include_usage,
        transfer_params,
    )


def parse_completion(body: dict[str, Any]) -> InferenceRequest:
    f = _Fields(body)
    prompt = f.required("prompt")
    text: str | None = None
    ids: list[int] | None = None
    if isinstance(prompt, str):
        text = prompt
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        text = prompt[0]
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        ids = [int(t) for t in prompt[0]]
    elif prompt is not None:
        if isinstance(prompt, list) and len(prompt) > 1:
            raise RequestError(
                400,
                "The simulator serves one prompt per request; send the prompts separately. "
                f"(parameter=prompt, value=<list of {len(prompt)} items>)",
                "BadRequestError",
                "prompt",
            )
        f._err("string_type", "prompt", "Input should be a valid string", prompt)
    model = _model(f)
    transfer_params = f.dict_("kv_transfer_params")
    max_tokens, temperature, seed, stop, stream, include_usage = _sampling(f, ("max_tokens",))
    return InferenceRequest(
        False, model, text, ids, max_tokens, temperature, seed, stop, stream, include_usage, transfer_params
    )


# Public names for the other request parsers of the simulator (dev endpoints, LoRA endpoints).
FieldChecker = _Fields
validation_error = _validation_error
