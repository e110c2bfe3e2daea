"""Sleep level 1 and level 2 cycles against a real GPU vLLM under `corral supervise`, with the GPU memory
in use (nvidia-smi) before and after every operation; the supervisor's VERIFY evidence beside it.

Prepared for a machine with a GPU and vLLM installed (not run where none was lent):

    python benchmarks/gpu_sleep_cycle.py --model Qwen/Qwen2.5-0.5B-Instruct --out $OUT/gpu_sleep_cycle.json

Writes one JSON document: per step the operation's status, the GPU memory used (MiB) before and after,
and the runbook steps with their evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def gpu_used_mib() -> list[int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [int(v) for v in out.split()]


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_state(sup: str, state: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if call(sup + "/v1/state")[1]["state"] == state:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"supervisor not {state} within {within}s")


def operation(sup: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    before = gpu_used_mib()
    status, op = call(sup + path, "POST", body)
    if status != 202:
        return {"path": path, "body": body, "refused": op, "gpu_mib_before": before}
    while True:
        op = call(f"{sup}/v1/operations/{op['operation_id']}")[1]
        if op["status"] != "running":
            break
        time.sleep(0.5)
    return {
        "path": path,
        "body": body,
        "operation": op,
        "gpu_mib_before": before,
        "gpu_mib_after": gpu_used_mib(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--startup-timeout", type=float, default=600)
    args = parser.parse_args()
    sup, engine_port = "http://127.0.0.1:8081", 8000
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "corral", "supervise", "--port", "8081",
            "--engine-url", f"http://127.0.0.1:{engine_port}", "--state-dir", "/tmp/gpu-sleep-cycle",
            "--", "vllm", "serve", args.model, "--host", "127.0.0.1", "--port", str(engine_port),
            "--enable-sleep-mode", "--gpu-memory-utilization", "0.5",
        ],
        env=env,
    )  # fmt: skip
    report: dict[str, Any] = {"model": args.model, "steps": []}
    try:
        wait_state(sup, "READY", args.startup_timeout)
        report["gpu_mib_ready"] = gpu_used_mib()
        for path, body in (
            ("/v1/sleep", {"level": 1, "mode": "wait"}),
            ("/v1/wake", {}),
            ("/v1/sleep", {"level": 2, "mode": "wait"}),
            ("/v1/wake", {}),  # refused: level 2 needs reload
            ("/v1/wake", {"reload": True}),
            ("/v1/reload", {"mode": "wait"}),
        ):
            report["steps"].append(operation(sup, path, body))
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
