"""The `/v1/models` probe: whether an engine answers its model list, and the model cards it lists.
Every membership source asks it the same way before it calls an engine READY."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from corral.engine.page_get import PageClient, PageError

ModelCard = dict[str, Any]  # one `data` entry, as vLLM sends it (id, root, parent, max_model_len, ...)


class ModelsProbeError(Exception):
    """A backend's /v1/models did not give a usable answer."""


def parse_model_cards(body: bytes) -> tuple[ModelCard, ...]:
    """The `data` entries of a vLLM /v1/models answer; raises ModelsProbeError on any other shape."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ModelsProbeError(f"/v1/models answered non-JSON: {exc}") from None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ModelsProbeError("/v1/models answered without a `data` list")
    cards = tuple(c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str))
    if not cards:
        raise ModelsProbeError("/v1/models lists no model")
    return cards


async def probe_models(
    client: PageClient, url: str, headers: Mapping[str, str] | None = None
) -> tuple[ModelCard, ...]:
    """GET `url`/v1/models once (the client's timeout applies). Raises ModelsProbeError, or the
    ConnectionError / TimeoutError of a failed call; `describe` words any of them."""
    status, body = await client.get(url, "/v1/models", headers)
    if status != 200:
        raise ModelsProbeError(f"GET /v1/models answered {status}")
    return parse_model_cards(body)


def describe(exc: BaseException) -> str:
    """A failed probe in a few words, for a membership reason."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc)
    if isinstance(exc, PageError) and text:
        return text  # it says what happened in words ("cannot connect to ...: Connection refused")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


PROBE_FAILURES = (ConnectionError, TimeoutError, ModelsProbeError)
