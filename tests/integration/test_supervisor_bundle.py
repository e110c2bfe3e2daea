"""The bundle fingerprint end to end: a supervisor over a simulator serving a local model directory
shows it in `/v1/state`, records it at READY and in every operation, and a changed model file gives
another fingerprint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support.model_dirs import make_model_dir
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until


def supervise(tmp_path: Path, model: Path, *engine_args: str) -> tuple[CorralProcess, str, Path]:
    port, engine_port = free_port(), free_port()
    state_dir = tmp_path / f"state-{port}"
    sim = [
        sys.executable,
        "-m",
        "corral",
        "sim",
        "--port",
        str(engine_port),
        "--model",
        str(model),
        *engine_args,
    ]
    args = ["supervise", "--port", str(port), "--engine-url", f"http://127.0.0.1:{engine_port}"]
    args += [
        "--state-dir",
        str(state_dir),
        "--quiet-period",
        "0.1",
        "--propagation-timeout",
        "0.5",
        "--",
        *sim,
    ]
    proc = CorralProcess(args)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/readyz", timeout=60)
    return proc, url, state_dir


def records(state_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (state_dir / "oplog.jsonl").read_bytes().splitlines()]


def test_the_bundle_is_shown_recorded_and_follows_the_model_files(tmp_path: Path) -> None:
    # a checkpoint the simulator (and PRECHECK) can size: config.json, tokenizer_config.json, weights
    small = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4}
    model = make_model_dir(tmp_path / "model", weights_bytes=1 << 20, hidden_size=128, **small)
    proc, url, state_dir = supervise(tmp_path, model, "--max-model-len", "1024")
    try:
        bundle = httpx.get(url + "/v1/state").json()["bundle"]
        assert bundle["model_files"]["files"] == 3
        assert bundle["command"]["max_model_len"] == "1024" and bundle["engine_version"]
        fingerprint = bundle["fingerprint"]
        oplog = records(state_dir)
        assert [r["fingerprint"] for r in oplog if r["record"] == "bundle"] == [fingerprint]
        ready = [r for r in oplog if r["record"] == "transition" and r["state"] == "READY"]
        assert ready[-1]["evidence"]["bundle"] == fingerprint
        assert httpx.post(url + "/v1/drain", json={}).status_code == 202
        wait_until(
            lambda: any(r["record"] == "operation" for r in records(state_dir)),
            30,
            "the drain operation record",
        )
        assert {r["bundle"] for r in records(state_dir) if r["record"] == "operation"} == {fingerprint}
    finally:
        proc.stop()

    make_model_dir(model, weights_bytes=1 << 20, hidden_size=256, **small)
    proc, url, _ = supervise(tmp_path, model, "--max-model-len", "1024")
    try:
        assert httpx.get(url + "/v1/state").json()["bundle"]["fingerprint"] != fingerprint
    finally:
        proc.stop()
