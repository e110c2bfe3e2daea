"""Secrets in an engine's command and environment never leave the supervisor: `--hf-token TOKEN` is
refused before anything starts (HF_TOKEN in the environment is the way), and the S3 keys of a
`--model-loader-extra-config` are masked in `/v1/state` (the command and the bundle's parts), the
operation log, the supervisor's output (its own lines and the engine's relayed ones, where the engine
prints its arguments) and an operation's change record. Real `corral supervise` over `corral sim`."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.test_engine_api_key import run_op
from tests.integration.test_supervisor_support import short_tmp_dir, sim_command, supervised
from tests.support.procs import CorralProcess, free_port

HF = "hf_supervisorSecret0a1b2c3d"
S3_KEY_ID = "AKIASUPERVISORTEST01"
S3_SECRET = "s3/supervisor+Secret0123456789"
ENV_SECRET = "aws-env-secret-5f4e3d2c"
LOADER = json.dumps(
    {
        "tensorizer_uri": "s3://bucket/m.tensors",
        "s3_access_key_id": S3_KEY_ID,
        "s3_secret_access_key": S3_SECRET,
    }
)
SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", "--itl-ms", "5")
SUP_ARGS = ("--propagation-timeout", "1", "--quiet-period", "0.2")


@pytest.mark.parametrize("form", ["separate", "inline"])
def test_an_hf_token_in_the_engine_command_is_refused_before_anything_starts(form: str) -> None:
    token = ["--hf-token", HF] if form == "separate" else [f"--hf-token={HF}"]
    port, engine_port = free_port(), free_port()
    proc = CorralProcess(
        [
            "supervise",
            "--port",
            str(port),
            "--engine-url",
            f"http://127.0.0.1:{engine_port}",
            "--state-dir",
            str(short_tmp_dir() / "state"),
            "--",
            *sim_command(engine_port, *token),
        ]
    )
    try:
        code: int | None = proc.wait_exit(timeout=30)
    except subprocess.TimeoutExpired:
        code = None  # it started the engine: the old behaviour
    output = proc.output()
    proc.stop()
    assert code == 2, output
    # the refusal is the contract: it names the flag and the variable to use, never the token
    assert "--hf-token" in output and "HF_TOKEN" in output  # what, and what to do instead
    assert HF not in output


def test_s3_keys_in_the_loader_config_show_nowhere() -> None:
    env = {"VLLM_SERVER_DEV_MODE": "1", "AWS_SECRET_ACCESS_KEY": ENV_SECRET}
    sim_args = (*SIM_ARGS, "--model-loader-extra-config", LOADER)
    with supervised(sim_args=sim_args, sup_args=SUP_ARGS, env=env) as sup:
        sup.wait_state("READY", timeout=30)
        slept = run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait"})
        assert slept["status"] == "succeeded", slept
        state = sup.state()
        output = sup.proc.output()
        record = json.dumps(slept["result"]["change_record"])
        shown = {
            "supervisor output": output,
            "operation log": (sup.state_dir / "oplog.jsonl").read_text(),
            "/v1/state": json.dumps(state),
            "change record": record,
        }
        for where, text in shown.items():
            for secret in (S3_SECRET, S3_KEY_ID, ENV_SECRET):
                assert secret not in text, f"a secret shows in the {where}"
        # the engine did print its loader config among its args: masked as relayed
        # the log is the contract here: no secret ever reaches it
        assert "'s3_secret_access_key': '<redacted>'" in output, output[-3000:]
        # what is not secret is still shown: the loader's URI, in the command and the bundle's parts
        assert "s3://bucket/m.tensors" in json.dumps(state["engine"]["argv"])
        assert "s3://bucket/m.tensors" in state["bundle"]["command"]["model_loader_extra_config"]
