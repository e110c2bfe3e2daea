"""The engine's role in prefill/decode disaggregation and its pairing identity, as the supervisor
publishes them (`/v1/state` and every state-stream line): the role `corral supervise --role` gives,
else the one its command's `--kv-transfer-config` kv_role means; the identity over the running
bundle's parts (`engine/pd_protocol.pairing_identity`), unknown until the bundle is read."""

from __future__ import annotations

from collections.abc import Sequence

from corral.engine.flags import serving_settings
from corral.engine.pd_protocol import connector_of, pairing_identity, parse_kv_transfer_config, role_of
from corral.supervisor.checks.bundle import Bundle


def kv_transfer_problem(argv: Sequence[str]) -> str | None:
    """What is wrong with the command's `--kv-transfer-config` (None: fine, or there is none)."""
    text = serving_settings(argv).get("kv_transfer_config")
    if not isinstance(text, str):
        return None
    try:
        parse_kv_transfer_config(text)
    except ValueError as exc:
        return str(exc)
    return None


def engine_role(argv: Sequence[str], declared: str | None = None) -> str:
    """`declared` when given, else the kv_role of the command's --kv-transfer-config (prefill for
    kv_producer, decode for kv_consumer), else both: an engine without a connector serves whole requests."""
    if declared is not None:
        return declared
    text = serving_settings(argv).get("kv_transfer_config")
    if not isinstance(text, str):
        return "both"
    try:
        return role_of(parse_kv_transfer_config(text))
    except ValueError:
        return "both"  # the CLI refused a bad one; a bundle's bad one fails the engine's own start


def engine_connector(argv: Sequence[str]) -> str | None:
    """The KV connector the command's --kv-transfer-config names (None without one): the router reads
    from it whether a prefill answer carries the transfer or the KV waits in a shared store."""
    return connector_of(serving_settings(argv))


def pairing_of(bundle: Bundle | None) -> str | None:
    """The pairing identity of the running bundle; None until it is known (paired with nothing)."""
    return pairing_identity(bundle.parts) if bundle is not None else None
