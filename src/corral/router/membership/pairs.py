"""Prefill/decode pairs per model, as `/v1/fleet` shows them: for each model that any endpoint serves in
a prefill or decode role, how many prefill and decode endpoints are routable, how many compatible
(prefill, decode) pairs they make, and in words why there is none when there is none."""

from __future__ import annotations

from typing import Any

from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership

SHOWN = 4  # endpoints named in one reason, the rest counted


def _label(endpoint: Endpoint) -> str:
    return endpoint.name or endpoint.url


def _pairing(endpoint: Endpoint) -> str:
    return endpoint.pairing or "unknown"


def unpaired_reason(membership: Membership, model: str, prefill: Endpoint, now: float | None = None) -> str:
    """Why `prefill` has no compatible decode endpoint for `model` now (for a 503 and /v1/fleet)."""
    if prefill.pairing is None:
        return (
            f"prefill {_label(prefill)} has no known pairing identity (no supervisor said one and its "
            "/version did not answer), so it is paired with nothing"
        )
    decode = [e for e in membership.eligible_role(model, "decode", now) if e is not prefill]
    if not decode:
        return f"no routable decode endpoint serves {model}"
    said = ", ".join(f"{_label(e)}={_pairing(e)}" for e in decode[:SHOWN])
    more = f" and {len(decode) - SHOWN} more" if len(decode) > SHOWN else ""
    return (
        f"prefill {_label(prefill)} has pairing identity {prefill.pairing}, no routable decode endpoint "
        f"has it ({said}{more}): their vLLM version, model, KV layout or KV connector differ"
    )


def model_pairs(membership: Membership, now: float | None = None) -> list[dict[str, Any]]:
    """One entry per model served in a prefill or decode role (models only served `both` have none)."""
    disaggregated = sorted({m for e in membership.endpoints() if e.role != "both" for m in e.models})
    out: list[dict[str, Any]] = []
    for model in disaggregated:
        prefill = membership.eligible_role(model, "prefill", now)
        decode = membership.eligible_role(model, "decode", now)
        pairs = 0
        unpaired: list[Endpoint] = []
        for endpoint in prefill:
            matches = len(membership.compatible_decode(model, endpoint, now))
            pairs += matches
            if not matches:
                unpaired.append(endpoint)
        if pairs:
            why = f"routable: {pairs} compatible prefill/decode pairs"
        elif not prefill:
            why = f"no routable prefill endpoint serves {model}"
        elif not decode:
            why = f"no routable decode endpoint serves {model}"
        else:
            why = "; ".join(unpaired_reason(membership, model, e, now) for e in unpaired[:SHOWN])
        out.append(
            {
                "model": model,
                "prefill_routable": len(prefill),
                "decode_routable": len(decode),
                "pairs": pairs,
                "unpaired_prefill": [_label(e) for e in unpaired],
                "why": why,
            }
        )
    return out
