"""The vLLM P/D facts Corral shares: roles from --kv-transfer-config, the two leg bodies, pairing identity."""

from __future__ import annotations

import json

import pytest

from corral.engine import pd_protocol as pd


def test_roles_follow_vllm_kv_role() -> None:
    assert pd.ROLES == ("prefill", "decode", "both")
    for kv_role, role in (("kv_producer", "prefill"), ("kv_consumer", "decode"), ("kv_both", "both")):
        assert pd.role_of({"kv_connector": "NixlConnector", "kv_role": kv_role}) == role
    assert pd.role_of({}) == "both"  # no connector: an aggregated engine
    with pytest.raises(ValueError, match="kv_sender"):
        pd.role_of({"kv_connector": "NixlConnector", "kv_role": "kv_sender"})


def test_parse_accepts_vllm_config() -> None:
    extra = {"kv_lease_duration": 2}
    text = json.dumps(
        {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
    )
    config = pd.parse_kv_transfer_config(text)
    assert config["kv_connector"] == "NixlConnector"
    assert pd.lease_seconds(config) == 2.0
    assert pd.lease_seconds({"kv_connector": "NixlConnector"}) == pd.DEFAULT_LEASE_SECONDS


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{kv_connector: Nixl", "is not JSON"),
        ("[1]", "not an object"),
        ('{"kv_role": "kv_both"}', "no kv_connector"),
        ('{"kv_connector": "NixlConnector"}', "kv_role None"),
        ('{"kv_connector": "NixlConnector", "kv_role": "producer"}', "kv_producer, kv_consumer, kv_both"),
        ('{"kv_connector": "X", "kv_role": "kv_both", "kv_connector_extra_config": 3}', "JSON object"),
        ('{"kv_connector": "X", "kv_role": "kv_both", "kv_load_failure_policy": "retry"}', "recompute"),
    ],
)
def test_parse_rejects_with_what_to_do(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        pd.parse_kv_transfer_config(text)


def test_lease_must_be_positive() -> None:
    with pytest.raises(ValueError, match="kv_lease_duration"):
        pd.lease_seconds({"kv_connector_extra_config": {"kv_lease_duration": 0}})


def test_prefill_leg_asks_for_remote_decode_and_one_token() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.3,
    }
    leg = pd.prefill_leg_body(body)
    assert leg["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert leg["max_tokens"] == 1 and leg["max_completion_tokens"] == 1
    assert leg["stream"] is False and "stream_options" not in leg
    assert leg["temperature"] == 0.3 and leg["messages"] == body["messages"]
    assert body["stream"] is True and "kv_transfer_params" not in body  # the client's body is untouched
    assert "max_completion_tokens" not in pd.prefill_leg_body({"model": "m", "prompt": "x"})


def test_decode_leg_carries_the_prefill_answers_params() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [1, 2]}
    answer = {"id": "cmpl-1", "choices": [], "kv_transfer_params": params}
    assert pd.transfer_params_of(answer) == params
    assert pd.transfer_params_of({"choices": []}) is None
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 9}
    leg = pd.decode_leg_body(body, params)
    assert leg == {**body, "kv_transfer_params": params}
    assert leg["kv_transfer_params"] is not params


def test_an_empty_params_object_names_no_transfer() -> None:
    assert pd.transfer_params_of({"choices": [], "kv_transfer_params": {}}) is None  # LMCacheMPConnector
    assert pd.transfer_params_of({"choices": [], "kv_transfer_params": None}) is None  # ExampleConnector


@pytest.mark.parametrize(
    ("connector", "handoff"),
    [
        ("NixlConnector", pd.PARAMS),
        ("NixlPushConnector", pd.PARAMS),
        ("MooncakeConnector", pd.PARAMS),
        ("ExampleConnector", pd.STORAGE),
        ("LMCacheConnectorV1", pd.STORAGE),
        ("MooncakeStoreConnector", pd.STORAGE),
        ("MultiConnector", None),
        ("MyOwnConnector", None),
        (None, None),
    ],
)
def test_handoff_of_a_connector(connector: str | None, handoff: str | None) -> None:
    assert pd.handoff_of(connector) == handoff


def _parts(**command: object) -> dict[str, object]:
    base: dict[str, object] = {"model": "org/llama", "dtype": "bfloat16"}
    base.update(command)
    return {"image": "img:1", "engine_version": "0.32.0", "served_models": ["llama"], "command": base}


def test_pairing_identity_ignores_role_parallel_size_and_image() -> None:
    producer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})
    consumer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"})
    p = _parts(kv_transfer_config=producer, tensor_parallel_size="1")
    d = _parts(kv_transfer_config=consumer, tensor_parallel_size="4")
    d["image"] = "img:2"
    assert pd.pairing_identity(p) == pd.pairing_identity(d)
    assert len(pd.pairing_identity(p)) == 16


@pytest.mark.parametrize(
    "change",
    [
        {"engine_version": "0.31.0"},
        {"command": {"model": "org/llama", "dtype": "float16"}},
        {"command": {"model": "org/llama", "dtype": "bfloat16", "revision": "abc"}},
        {"command": {"model": "org/llama", "dtype": "bfloat16", "quantization": "fp8"}},
        {"command": {"model": "org/llama", "dtype": "bfloat16", "kv_cache_dtype": "fp8"}},
        {"command": {"model": "org/llama", "dtype": "bfloat16", "block_size": "32"}},
        {
            "command": {
                "model": "org/llama",
                "dtype": "bfloat16",
                "kv_transfer_config": '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}',
            }
        },
        {"model_files": {"digest": "ff"}},
    ],
)
def test_pairing_identity_differs_on_each_part_that_matters(change: dict[str, object]) -> None:
    nixl = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
    base = _parts()
    base["command"]["kv_transfer_config"] = nixl  # type: ignore[index]
    other = {**base, **change}
    if "command" in change and "kv_transfer_config" not in change["command"]:  # type: ignore[operator]
        other["command"] = {**change["command"], "kv_transfer_config": nixl}  # type: ignore[dict-item]
    assert pd.pairing_identity(base) != pd.pairing_identity(other)


def test_connector_from_either_flag() -> None:
    assert pd.connector_of({"kv_connector": "NixlConnector"}) == "NixlConnector"
    assert pd.connector_of({"kv_transfer_config": '{"kv_connector": "NixlConnector"}'}) == "NixlConnector"
    assert pd.connector_of({"kv_transfer_config": "not json"}) == "not json"
    assert pd.connector_of({}) is None


def test_block_size_on_the_command_line_changes_the_pairing_identity() -> None:
    """--block-size reaches the bundle's parts through the flags table (supervisor and PRECHECK build both
    with bundle_from), so two engines differing only in it never pair."""
    from corral.supervisor.checks.bundle import bundle_from

    nixl = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
    argv = ["vllm", "serve", "org/llama", "--kv-transfer-config", nixl]
    models = [{"id": "org/llama"}]
    b16 = bundle_from([*argv, "--block-size", "16"], "0.32.0", models)
    b32 = bundle_from([*argv, "--block-size=32"], "0.32.0", models)
    assert b32.parts["command"]["block_size"] == "32"
    assert pd.pairing_identity(b16.parts) != pd.pairing_identity(b32.parts)
    assert b16.fingerprint != b32.fingerprint
