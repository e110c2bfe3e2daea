"""The P/D pairing identity of an engine without a supervisor, from what the engine itself says: its
`GET /version` and the model root of its `/v1/models` cards, hashed as `pd_protocol.pairing_identity`
hashes a bundle's parts. It catches a prefill and a decode engine on different vLLM versions or models;
dtype, quantization, KV layout and the KV connector are only known to a supervisor (its identity covers
them; vLLM serves its --kv-transfer-config nowhere outside dev mode), so the P/D data path treats a
static engine's connector as unknown (router/datapath/pd.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from corral.engine.models_probe import ModelCard
from corral.engine.page_get import PageClient
from corral.engine.pd_protocol import pairing_identity


def base_model(cards: Sequence[ModelCard]) -> str | None:
    """The model the engine runs: the `root` (else `id`) of its first card that is not an adapter."""
    for card in cards:
        if not card.get("parent"):
            root = card.get("root") or card.get("id")
            return str(root) if root is not None else None
    return None


def static_pairing(version: str, cards: Sequence[ModelCard]) -> str:
    """The identity over (vLLM version, model): the bundle parts an engine tells anyone who asks."""
    return pairing_identity({"engine_version": version, "command": {"model": base_model(cards)}})


async def probe_pairing(
    client: PageClient,
    url: str,
    cards: Sequence[ModelCard],
    headers: Mapping[str, str] | None = None,
) -> str | None:
    """GET `url`/version once (the client's timeout applies); the identity, or None when the engine
    did not say its version (an unknown identity is paired with nothing)."""
    try:
        status, raw = await client.get(url, "/version", headers)
        if status != 200:
            return None
        body = orjson.loads(raw)
    except (ConnectionError, TimeoutError, orjson.JSONDecodeError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, str) or not version:
        return None
    return static_pairing(version, cards)
