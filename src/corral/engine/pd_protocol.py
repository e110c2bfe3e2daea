"""vLLM's prefill/decode disaggregation protocol as every part of Corral shares it: an engine's role from
its `--kv-transfer-config`, the two request bodies a P/D proxy sends (as vLLM's own proxy builds them for
the NIXL connector), how each known connector hands the KV over (params or a shared store), and which
bundle parts must be equal for a prefill and a decode engine to pair.

Facts from vLLM 0.32 (config/kv_transfer.py `KVTransferConfig`, kv_connector/v1/nixl/*_scheduler.py
`request_finished`, entrypoints/openai `kv_transfer_params`); see docs/pd-conformance.md.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

ROLES = ("prefill", "decode", "both")
# vLLM's KVTransferConfig.kv_role values and the role each gives an engine.
KV_ROLES: dict[str, str] = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}

TRANSFER_PARAMS = "kv_transfer_params"
# The keys vLLM's NIXL scheduler reads from a request's kv_transfer_params.
DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"
REMOTE_ENGINE_ID = "remote_engine_id"
REMOTE_REQUEST_ID = "remote_request_id"
REMOTE_BLOCK_IDS = "remote_block_ids"
REMOTE_HOST = "remote_host"
REMOTE_PORT = "remote_port"
TP_SIZE = "tp_size"
# Seconds the prefill engine holds the blocks of a finished prefill for its decode engine (vLLM's
# kv_connector_extra_config["kv_lease_duration"], default 30; it replaced VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
LEASE_KEY = "kv_lease_duration"
DEFAULT_LEASE_SECONDS = 30.0
# vLLM's kv_load_failure_policy: "fail" (the default) finishes the request with an error, "recompute"
# reschedules it to compute the blocks that failed to load.
FAILURE_POLICIES = ("fail", "recompute")
DEFAULT_FAILURE_POLICY = "fail"


def parse_kv_transfer_config(text: str) -> dict[str, Any]:
    """`--kv-transfer-config` as vLLM takes it: a JSON object with `kv_connector` and a known `kv_role`."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"--kv-transfer-config {text!r} is not JSON ({exc.msg} at position {exc.pos}); "
            'write it as vLLM takes it, e.g. \'{"kv_connector": "NixlConnector", "kv_role": "kv_both"}\''
        ) from None
    if not isinstance(config, dict):
        raise ValueError(
            f"--kv-transfer-config {text!r} is a JSON {type(config).__name__}, not an object; "
            'write it as {"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
        )
    connector = config.get("kv_connector")
    if not isinstance(connector, str) or not connector:
        raise ValueError(
            f"--kv-transfer-config {text!r} has no kv_connector; name the connector, "
            'e.g. "kv_connector": "NixlConnector"'
        )
    kv_role = config.get("kv_role")
    if kv_role not in KV_ROLES:
        raise ValueError(
            f"--kv-transfer-config has kv_role {kv_role!r}; vLLM takes one of {', '.join(KV_ROLES)} "
            "(kv_producer for a prefill engine, kv_consumer for a decode engine, kv_both for either)"
        )
    extra = config.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        raise ValueError(
            f"--kv-transfer-config has kv_connector_extra_config {extra!r}; it must be a JSON object"
        )
    policy = config.get("kv_load_failure_policy", DEFAULT_FAILURE_POLICY)
    if policy not in FAILURE_POLICIES:
        raise ValueError(
            f"--kv-transfer-config has kv_load_failure_policy {policy!r}; vLLM takes one of "
            f"{', '.join(FAILURE_POLICIES)}"
        )
    return config


def role_of(kv_transfer_config: dict[str, Any]) -> str:
    """`prefill`, `decode` or `both` from a parsed config's kv_role (no connector: an aggregated engine,
    `both`). An unknown kv_role raises ValueError as parse_kv_transfer_config does."""
    if not kv_transfer_config.get("kv_connector"):
        return "both"
    kv_role = kv_transfer_config.get("kv_role")
    if kv_role not in KV_ROLES:
        raise ValueError(f"kv_role {kv_role!r} is not one of vLLM's {', '.join(KV_ROLES)}")
    return KV_ROLES[kv_role]


def lease_seconds(kv_transfer_config: dict[str, Any]) -> float:
    """How long a prefill engine holds a finished prefill's blocks for its decode engine."""
    extra = kv_transfer_config.get("kv_connector_extra_config") or {}
    value = extra.get(LEASE_KEY, DEFAULT_LEASE_SECONDS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"kv_connector_extra_config.{LEASE_KEY} is {value!r}; give a positive number of seconds"
        )
    return float(value)


def prefill_leg_body(body: dict[str, Any]) -> dict[str, Any]:
    """What a P/D proxy sends the prefill engine for a client's body: ask for remote decode, one token,
    no streaming; the client's other fields are kept."""
    leg = dict(body)
    leg[TRANSFER_PARAMS] = {
        DO_REMOTE_DECODE: True,
        DO_REMOTE_PREFILL: False,
        REMOTE_ENGINE_ID: None,
        REMOTE_BLOCK_IDS: None,
        REMOTE_HOST: None,
        REMOTE_PORT: None,
    }
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    leg["stream"] = False
    leg.pop("stream_options", None)
    return leg


def transfer_params_of(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The kv_transfer_params a prefill engine's answer returns for the decode engine (None when absent
    or empty: LMCacheMPConnector answers `{}`, which names no blocks)."""
    params = answer.get(TRANSFER_PARAMS)
    return params if isinstance(params, dict) and params else None


# How a connector hands a finished prefill's KV to the decode engine, as the prefill answer shows it.
# PARAMS: the answer's kv_transfer_params say where the blocks are, and the decode leg must carry them.
# STORAGE: the prefill engine saves the prompt's KV in a store the decode engine also reaches, keyed by
# the prompt's tokens; the answer carries no params and the decode leg is the client's body as it came.
PARAMS = "params"
STORAGE = "storage"
# Checked in vLLM 0.32 (distributed/kv_transfer/kv_connector/factory.py names; each connector's scheduler
# `request_finished`, whose second value becomes the answer's kv_transfer_params):
# - NixlConnector, NixlPullConnector, NixlPushConnector: nixl/base_scheduler.py builds the params above.
# - MooncakeConnector, MoRIIOConnector: their proxies hand both legs a transfer id and bootstrap address
#   they make up (mooncake/mooncake_connector.py, moriio/); Corral's router does not speak that flow, so
#   an answer without params from them is an error too, not a storage hand-off.
PARAMS_CONNECTORS = frozenset(
    {"NixlConnector", "NixlPullConnector", "NixlPushConnector", "MooncakeConnector", "MoRIIOConnector"}
)
# - ExampleConnector: the base class's request_finished (no params); example_connector.py saves each
#   prompt's KV per layer under kv_connector_extra_config.shared_storage_path/<hash of its tokens>/ and
#   loads it for any later prompt whose tokens hash the same (`_found_match_for_prompt`).
# - LMCacheConnectorV1: lmcache_integration/vllm_v1_adapter.py returns params only when asked
#   `ret_first_tok`; LMCacheMPConnector returns `{}`. Both look KV up in LMCache by the tokens.
# - MooncakeStoreConnector (mooncake/store/connector.py) and HF3FSKVConnector (hf3fs/hf3fs_connector.py):
#   no params; a shared KV pool keyed by the tokens' hashes.
STORAGE_CONNECTORS = frozenset(
    {
        "ExampleConnector",
        "LMCacheConnectorV1",
        "LMCacheMPConnector",
        "MooncakeStoreConnector",
        "HF3FSKVConnector",
    }
)


def handoff_of(connector: str | None) -> str | None:
    """PARAMS or STORAGE for a connector whose hand-off is known, None for any other (or no) name
    (MultiConnector depends on the connectors it wraps)."""
    if connector in PARAMS_CONNECTORS:
        return PARAMS
    if connector in STORAGE_CONNECTORS:
        return STORAGE
    return None


def decode_leg_body(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The client's body carrying the prefill answer's kv_transfer_params to the decode engine."""
    leg = dict(body)
    leg[TRANSFER_PARAMS] = dict(params)
    return leg


# The bundle-fingerprint parts (supervisor/checks/bundle.py; `command.X` is a setting of the engine's
# command line, engine/flags.py) that must be equal for a prefill and a decode engine to pair. In, because
# the transferred KV blocks must mean the same thing on both sides (vLLM's NIXL compatibility hash,
# nixl/metadata.py, covers the vLLM version, model, dtype and KV cache dtype; its handshake checks the
# block size): engine_version, the model and its revisions and files, dtype, quantization, kv_cache_dtype,
# block_size, and the connector (`kv_connector` of --kv-transfer-config, not its kv_role, which differs by
# design). Out: tensor/pipeline/data-parallel sizes (NIXL maps heterogeneous TP, nixl/tp_mapping.py), the
# image (packaging; the version the engine reports is what NIXL checks), hardware (not always known, and
# vLLM allows heterogeneous P/D hardware), max_model_len, served names and templates (request-side).
PAIRING_PARTS: tuple[str, ...] = (
    "engine_version",
    "model_files",
    "command.model",
    "command.revision",
    "command.code_revision",
    "command.tokenizer",
    "command.tokenizer_revision",
    "command.dtype",
    "command.quantization",
    "command.kv_cache_dtype",
    "command.block_size",
    "command.kv_connector",
)


def connector_of(command: dict[str, Any]) -> str | None:
    """The connector a command line names: `kv_connector` of --kv-transfer-config (the raw text when it is
    not a JSON object), else --kv-connector."""
    text = command.get("kv_transfer_config")
    if isinstance(text, str):
        try:
            config = json.loads(text)
        except json.JSONDecodeError:
            return text
        if isinstance(config, dict):
            connector = config.get("kv_connector")
            return str(connector) if connector is not None else None
        return text
    value = command.get("kv_connector")
    return str(value) if value is not None else None


def pairing_values(parts: dict[str, Any]) -> dict[str, Any]:
    """The values of PAIRING_PARTS in a bundle's parts (Bundle.parts or its JSON); absent parts are None."""
    command = parts.get("command") or {}
    values: dict[str, Any] = {}
    for name in PAIRING_PARTS:
        if name == "command.kv_connector":
            values[name] = connector_of(command)
        elif name.startswith("command."):
            values[name] = command.get(name.removeprefix("command."))
        else:
            values[name] = parts.get(name)
    return values


def pairing_identity(parts: dict[str, Any]) -> str:
    """A short stable hash of PAIRING_PARTS: a prefill and a decode engine may pair iff theirs are equal."""
    text = json.dumps(pairing_values(parts), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
