"""The one prepared GPU check of memory truth (issue 14): on a host with an NVIDIA GPU and vLLM, a real
engine under `corral supervise`, with every memory figure read through NVML (source "nvml"):

  1. the NVML inventory and PRECHECK's arithmetic (`corral supervise --explain`);
  2. a supervised start to READY, and vLLM's logged `GPU KV cache size` against the budget;
  3. sleep 1 -> wake, sleep 2 -> wake with reload, KV release (level-0 keep pause) -> wake, reload:
     each operation's VERIFY with its memory verdict, and NVML's reading of the engine's process tree
     after it (GiB per GPU);
  4. `corral verify --require-measured` on the supervisor.

It prints a table (GiB per step) and writes one JSON result. Exit 0 when every operation succeeded with
its memory measured (source nvml) and passed, 1 otherwise; 2 when this host has no GPU (NVML sees
none) or no `vllm` command, saying so.

On a lent GPU machine, from the repository root, with vLLM installed and the model on local disk
(the machine reaches nothing outside it), one command, about 4-6 minutes of device time (a 0.5B model
starts in ~1-2 min with CUDA graphs; each operation takes seconds):

    VLLM_SERVER_DEV_MODE=1 python benchmarks/gpu_sleep_cycle.py \
        --model Qwen/Qwen2.5-0.5B-Instruct --out $OUT/gpu_sleep_cycle.json

(`--model` may be a local directory; a hub id must already be in the HF cache: HF_HUB_OFFLINE=1.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from corral.engine.gpus import read_gpus
from corral.supervisor.lifecycle.device_memory import GIB, read_device_sync

NO_DEVICE = 2
OPERATIONS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("sleep level 1", "/v1/sleep", {"level": 1, "mode": "wait"}),
    ("wake", "/v1/wake", {}),
    ("sleep level 2", "/v1/sleep", {"level": 2, "mode": "wait"}),
    ("wake + reload", "/v1/wake", {"reload": True}),
    ("KV release", "/v1/sleep", {"level": 0, "mode": "keep", "release_kv": True}),
    ("wake (KV)", "/v1/wake", {}),
    ("reload", "/v1/reload", {"mode": "wait"}),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_state(sup: str, states: tuple[str, ...], within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = call(sup + "/v1/state")[1]
            if last.get("state") in states:
                return last
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"supervisor not {'/'.join(states)} within {within:g}s (last: {last.get('reason')})")


def engine_gib(state: dict[str, Any]) -> dict[str, float] | None:
    """NVML's reading of the engine's process tree now, GiB per GPU UUID."""
    reading = read_device_sync((state.get("engine") or {}).get("pid"))
    return None if reading is None else {g: round(b / GIB, 2) for g, b in reading.gpus.items()}


def run_operation(sup: str, name: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    status, op = call(sup + path, "POST", body)
    row: dict[str, Any] = {"step": name, "path": path, "body": body}
    if status != 202:
        return {**row, "status": "refused", "answer": op}
    while op.get("status") == "running":
        time.sleep(0.5)
        op = call(f"{sup}/v1/operations/{op['operation_id']}")[1]
    state = call(sup + "/v1/state")[1]
    memory = (state.get("memory") or {}).get("last") or {}
    return {
        **row,
        "status": op.get("status"),
        "seconds": round(time.monotonic() - started, 2),
        "memory_outcome": memory.get("outcome"),
        "memory_source": memory.get("source"),
        "memory_reason": memory.get("reason"),
        "engine_gib_after": engine_gib(state),
        "operation": op,
    }


def explain(corral: list[str], flags: list[str], engine: list[str], env: dict[str, str]) -> dict[str, Any]:
    """PRECHECK's arithmetic for the engine command (NVML inventory, budget), as an operator reads it."""
    done = subprocess.run(
        [*corral, "supervise", "run", *flags, "--explain", "--", *engine],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return {"exit_code": done.returncode, "output": done.stdout + done.stderr}


def verify(corral: list[str], sup: str, record: Path) -> dict[str, Any]:
    args = [*corral, "verify", "--supervisor", sup, "--require-measured", "--record", str(record)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    body = json.loads(record.read_text()) if record.exists() else {}
    return {"exit_code": done.returncode, "checks": body.get("checks"), "output": done.stdout[-4000:]}


def table(report: dict[str, Any]) -> str:
    rows = [("step", "status", "memory", "source", "GiB per GPU (engine tree, NVML)")]
    ready = report.get("ready") or {}
    rows.append(("READY", "-", str(ready.get("memory_outcome")), "-", json.dumps(ready.get("engine_gib"))))
    for s in report["steps"]:
        gib = s.get("engine_gib_after")
        shown = ", ".join(f"{g[:12]} {v:.2f}" for g, v in gib.items()) if gib else str(gib)
        rows.append(
            (s["step"], str(s["status"]), str(s.get("memory_outcome")), str(s.get("memory_source")), shown)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A local model directory or a cached hub id.")
    parser.add_argument("--out", type=Path, required=True, help="Where the JSON result goes.")
    parser.add_argument("--gpu-memory-utilization", default="0.5")
    parser.add_argument("--max-model-len", default="4096")
    parser.add_argument("--startup-timeout", type=float, default=600)
    args = parser.parse_args()
    gpus = read_gpus()
    if not gpus:
        print("no GPU here: NVML is not available or sees no device; run this on a GPU host", file=sys.stderr)
        return NO_DEVICE
    if shutil.which("vllm") is None:
        print("no `vllm` command here: install vLLM (with CUDA) on the GPU host first", file=sys.stderr)
        return NO_DEVICE
    corral = [sys.executable, "-m", "corral"]
    sup_port, engine_port = free_port(), free_port()
    sup = f"http://127.0.0.1:{sup_port}"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    engine = [
        "vllm", "serve", args.model, "--host", "127.0.0.1", "--port", str(engine_port),
        "--enable-sleep-mode", "--gpu-memory-utilization", args.gpu_memory_utilization,
        "--max-model-len", args.max_model_len,
    ]  # fmt: skip
    floating = [] if Path(args.model).is_dir() else ["--allow-floating-revision"]
    report: dict[str, Any] = {
        "model": args.model,
        "gpus": [g.to_json() for g in gpus],
        "engine_command": engine,
        "explain": explain(corral, floating, engine, env),
        "steps": [],
    }
    print(report["explain"]["output"])
    state_dir = Path(tempfile.mkdtemp(prefix="gpu-sleep-cycle-"))
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            *corral, "supervise", "run", "--port", str(sup_port), "--engine-url",
            f"http://127.0.0.1:{engine_port}", "--state-dir", str(state_dir / "state"),
            "--startup-timeout", str(args.startup_timeout), *floating, "--", *engine,
        ],
        env=env,
    )  # fmt: skip
    ok = False
    try:
        state = wait_state(sup, ("READY", "FAILED"), args.startup_timeout + 60)
        memory = state.get("memory") or {}
        report["ready"] = {
            "state": state.get("state"),
            "seconds": round(time.monotonic() - started, 1),
            "kv_cache_tokens": state.get("kv_cache_tokens"),
            "kv_capacity": memory.get("kv_capacity"),
            "logged": memory.get("logged"),
            "memory_outcome": (memory.get("last") or {}).get("outcome"),
            "engine_gib": engine_gib(state),
            "precheck": state.get("precheck"),
        }
        if state.get("state") != "READY":
            return 1
        for name, path, body in OPERATIONS:
            report["steps"].append(run_operation(sup, name, path, body))
            wait_state(sup, ("READY", "SLEEPING", "FAILED"), 300)
        report["verify"] = verify(corral, sup, state_dir / "verify.json")
        ok = all(s["status"] == "succeeded" for s in report["steps"]) and all(
            s["memory_outcome"] == "passed" and s["memory_source"] == "nvml" for s in report["steps"]
        )
    finally:
        report["ok"] = ok
        report["seconds"] = round(time.monotonic() - started, 1)
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str))
        if report["steps"]:
            print(table(report))
        print(f"result: {args.out} ({'ok' if ok else 'NOT ok'}, {report['seconds']}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
