"""The one redaction list (corral.redaction): secret flags in both forms, secret keys at any depth of a
JSON-valued argument, secret environment names, and what a record keeps of a bundle."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.bundle_spec import BundleError, BundleSpec, bundle_from_json, bundle_record, unrecorded_secrets
from corral.redaction import MASK, Redactor, is_secret_name, redact_argv, refused_flag, secret_values
from corral.supervisor.checks.bundle import command_parts

HF = "hf_0123456789abcdefSECRET"
S3 = "s3SecretKey/abcdef+0123"
TK = "tk-1"
KV = json.dumps({"kv_connector": "X", "kv_connector_extra_config": {"token": TK}})
LOADER = json.dumps(
    {"tensorizer_uri": "s3://b/m.tensors", "s3_secret_access_key": S3, "n": {"password": "pw-1"}}
)


def test_both_forms_of_each_secret_flag_and_json_at_any_depth_are_masked() -> None:
    argv = [
        "vllm", "serve", "m", "--hf-token", HF, f"--hf-token={HF}", "--model-loader-extra-config", LOADER,
        "--kv-transfer-config=" + KV,
    ]  # fmt: skip
    shown = redact_argv(argv)
    text = " ".join(shown)
    for secret in (HF, S3, "pw-1", TK):
        assert secret not in text
    assert shown[:5] == ["vllm", "serve", "m", "--hf-token", MASK]
    assert shown[5] == f"--hf-token={MASK}"
    loader = json.loads(shown[7])
    assert loader == {
        "tensorizer_uri": "s3://b/m.tensors",
        "s3_secret_access_key": MASK,
        "n": {"password": MASK},
    }
    assert json.loads(shown[8].partition("=")[2])["kv_connector"] == "X"
    # every value masked is also masked in free text (the engine prints its args)
    assert set(secret_values(argv)) == {HF, S3, "pw-1", TK}


def test_json_without_a_secret_is_left_byte_for_byte() -> None:
    config = '{"kv_connector": "NixlConnector",  "kv_role": "kv_both"}'
    assert redact_argv(["--kv-transfer-config", config]) == ["--kv-transfer-config", config]
    assert command_parts(["--kv-transfer-config", config])["kv_transfer_config"] == config
    masked = command_parts(["--model-loader-extra-config", LOADER])["model_loader_extra_config"]
    assert S3 not in masked and MASK in masked


@pytest.mark.parametrize(
    "name",
    ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
     "S3_SECRET_ACCESS_KEY", "s3_access_key_id", "db_password", "sessionToken", "MY_SERVICE_KEY",
     "x-api-key"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["VLLM_SERVER_DEV_MODE", "CORRAL_IMAGE", "MAX_TOKENS", "HF_TOKEN_PATH", "kv_role", "kv_lease_duration",
     "s3_endpoint", "AWS_ENDPOINT_URL", "encryption_keyfile", "tensorizer_uri"],
)  # fmt: skip
def test_names_that_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_hf_token_with_a_value_is_refused_and_a_bare_one_is_not() -> None:
    for argv in (["--hf-token", HF], [f"--hf-token={HF}"]):
        refused = refused_flag(argv)
        assert refused is not None and refused[0] == "--hf-token" and "HF_TOKEN" in refused[1]
    assert refused_flag(["--hf-token", "--port", "8000"]) is None
    with pytest.raises(BundleError) as caught:
        bundle_from_json({"name": "b", "engine_args": ["--hf-token", HF]}, "b.yaml")
    assert "--hf-token" in str(caught.value) and HF not in str(caught.value)


def test_a_record_keeps_environment_values_except_secrets_and_rollback_sees_what_it_lost() -> None:
    bundle = BundleSpec(
        name="v2",
        engine_args=("--model-loader-extra-config", LOADER),
        env={"VLLM_SERVER_DEV_MODE": "1", "HF_TOKEN": HF, "AWS_SECRET_ACCESS_KEY": S3},
    )
    kept = bundle_record(bundle)
    assert HF not in json.dumps(kept) and S3 not in json.dumps(kept)
    assert kept["env"] == {"VLLM_SERVER_DEV_MODE": "1", "HF_TOKEN": MASK, "AWS_SECRET_ACCESS_KEY": MASK}
    assert unrecorded_secrets(bundle_from_json(kept, "record")) == [
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "engine_args",
    ]
    plain = BundleSpec(name="v1", engine_args=("--max-model-len", "8192"), env={"VLLM_SERVER_DEV_MODE": "1"})
    assert bundle_record(plain) == plain.to_json()
    assert unrecorded_secrets(bundle_from_json(bundle_record(plain), "record")) == []


@settings(deadline=None, max_examples=200)
@given(
    secret=st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters='"\\'), min_size=4),
    depth=st.integers(min_value=0, max_value=5),
    inline=st.booleans(),
)
def test_a_secret_key_at_any_depth_never_shows(secret: str, depth: int, inline: bool) -> None:
    body: object = {"aws_secret_access_key": secret}
    for level in range(depth):
        body = {f"level{level}": [body]}
    text = json.dumps(body)
    argv = [f"--model-loader-extra-config={text}"] if inline else ["--model-loader-extra-config", text]
    shown = redact_argv(argv)
    assert MASK in " ".join(shown)
    assert json.loads(shown[-1].partition("=")[2] if inline else shown[-1]) != body
    line = f"non-default args: {{'model_loader_extra_config': {json.loads(text)!r}}}"
    assert secret not in Redactor(secret_values(argv))(line)
