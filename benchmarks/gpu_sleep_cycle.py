"""The one prepared GPU check of memory truth (issue 14): on a host with an NVIDIA GPU and vLLM, a real
engine under `corral supervise`, with every memory figure read through NVML (source "nvml"):

  1. the NVML inventory and PRECHECK's arithmetic (`corral supervise --explain`);
  2. a supervised start to READY, and vLLM's logged `GPU KV cache size` against the budget;
  3. sleep 1 -> wake, sleep 2 -> wake with reload, KV release (level-0 keep pause) -> wake, reload:
     each operation's VERIFY with its memory verdict, and NVML's reading of the engine's process tree
     after it (GiB per GPU);
  4. `corral verify --require-measured` on the supervisor.

Around them, the checks that must hold on a real vLLM, which reports neither its weights' size nor its
memory (issue 29):
  - host RAM before a level-1 sleep: first with the host's room narrowed to 64 MiB (one more cgroup
    directory the supervisor counts, `CORRAL_MEMORY_CGROUP`, whose files this script writes) the sleep
    must be refused naming host memory, with nothing moved (READY); then, with the room back, the real
    level-1 sleep's PRECHECK must have passed on the weights' size from the model files (source
    `precheck_budget`) against the host's real MemAvailable and cgroups;
  - KV-only release: VERIFY's NVML verdict passed, which now also means no GPU freed more than the
    KV share (the weights stayed resident), vLLM's sleep-state gauge names no offload; and the wake
    after it moved the prefix epoch (`/v1/state` `prefix_cache.epoch`), with its VERIFY's prefix
    evidence;
  - reload identity: `reload_weights` answered for every rank (vLLM's per-worker `collective_rpc`
    results), the bundle fingerprinted again (from → to; the files unchanged here, so the same
    fingerprint and `unchanged`, or `not_measured` for a hub id), startup's KV-capacity check repeated
    on the same logged KV size (vLLM sizes its KV cache once, at start), and a smoke that is a real
    completion of the served model. A rank that raises and files that change cannot be provoked on
    a real engine here: tests/integration/test_reload_identity.py covers those on the simulator;
  - LoRA (the engine runs with `--enable-lora`, unless `--no-lora`): a rank-8 adapter written by this script
    from the model's config.json (zero B matrices: the base model's answers) is loaded and unloaded
    through the supervisor. Each VERIFY read the engine's GPU memory through NVML and its KV capacity from
    `vllm:cache_config_info` before and after: the load must keep every KV block (vLLM reserves the
    `--max-loras` slots at start), and the unload must free what the load took. Both figures are in the
    row (`lora`), measured (nvml) and passed.

It prints a table (GiB per step, and each step's checks) and writes one JSON result. Exit 0 when every
operation ended as expected (succeeded, or refused where a refusal is the check) with its memory
measured (source nvml) and passed and its checks true, 1 otherwise; 2 when this host has no GPU (NVML
sees none) or no `vllm` command, saying so.

On a lent GPU machine, from the repository root, with vLLM installed and the model on local disk
(the machine reaches nothing outside it), one command, about 4-6 minutes of device time (a 0.5B model
starts in ~1-2 min with CUDA graphs; each operation takes seconds; the refused sleep, none):

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.engine.gpus import read_gpus
from corral.supervisor.lifecycle.device_memory import GIB, read_device_sync

NO_DEVICE = 2
HOST_RAM_SHORT = 64 << 20  # bytes the narrowed host leaves: less than any model's weights
LORA_NAME = "gpu-check-lora"
LORA_RANK = 8


@dataclass(frozen=True)
class Operation:
    """One runbook call: what it is, what must come of it, and the host room it runs with."""

    name: str
    path: str
    body: dict[str, Any]
    expect: str = "succeeded"  # or "refused" (409 at PRECHECK)
    host_room: int | None = None  # bytes the extra cgroup leaves during this step; None: no narrowing


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "sleep 1 (host RAM short)", "/v1/sleep", {"level": 1, "mode": "wait"}, "refused", HOST_RAM_SHORT
    ),
    Operation("sleep level 1", "/v1/sleep", {"level": 1, "mode": "wait"}),
    Operation("wake", "/v1/wake", {}),
    Operation("sleep level 2", "/v1/sleep", {"level": 2, "mode": "wait"}),
    Operation("wake + reload", "/v1/wake", {"reload": True}),
    Operation("KV release", "/v1/sleep", {"level": 0, "mode": "keep", "release_kv": True}),
    Operation("wake (KV)", "/v1/wake", {}),
    Operation("reload", "/v1/reload", {"mode": "wait"}),
)


def lora_operations(adapter: Path) -> tuple[Operation, ...]:
    return (
        Operation("lora load", "/v1/lora/load", {"name": LORA_NAME, "path": str(adapter)}),
        Operation("lora unload", "/v1/lora/unload", {"name": LORA_NAME}),
    )


def model_config(model: str) -> dict[str, Any]:
    """The model's config.json: from its directory, or from the HF cache (nothing is downloaded)."""
    if Path(model).is_dir():
        return dict(json.loads((Path(model) / "config.json").read_text()))
    from huggingface_hub import hf_hub_download  # type: ignore[import-not-found]  # on the GPU host

    return dict(json.loads(Path(hf_hub_download(model, "config.json", local_files_only=True)).read_text()))


def write_adapter(model: str, out: Path, rank: int = LORA_RANK) -> Path:
    """A PEFT LoRA adapter on every layer's q_proj and v_proj, shaped from the model's config; its B
    matrices are zero, so the adapter answers as the base model does. Needs torch and safetensors
    (both come with vLLM)."""
    import torch  # type: ignore[import-not-found]  # on the GPU host, with vLLM
    from safetensors.torch import save_file  # type: ignore[import-not-found]

    config = model_config(model)
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_out = int(config.get("num_key_value_heads") or heads) * head_dim
    tensors: dict[str, Any] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module, out_features in (("q_proj", heads * head_dim), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, dtype=torch.float16) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.zeros(out_features, rank, dtype=torch.float16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": model,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out


def set_host_room(cgroup: Path, room: int | None) -> None:
    """The extra cgroup the supervisor counts (`CORRAL_MEMORY_CGROUP`): no limit, or `room` bytes free."""
    cgroup.mkdir(parents=True, exist_ok=True)
    (cgroup / "memory.max").write_text("max\n" if room is None else f"{room}\n")
    (cgroup / "memory.current").write_text("0\n")
    (cgroup / "memory.stat").write_text("inactive_file 0\n")


def step_evidence(row: dict[str, Any], step: str) -> dict[str, Any]:
    """One runbook step's evidence from the operation's result (empty when it did not run)."""
    steps = ((row.get("operation") or {}).get("result") or {}).get("steps") or []
    found = [s.get("evidence") or {} for s in steps if s.get("step") == step]
    return found[-1] if found else {}


def prefix_epoch(state: dict[str, Any]) -> Any:
    return (state.get("prefix_cache") or {}).get("epoch")


def step_checks(
    op: Operation, row: dict[str, Any], before: dict[str, Any], after: dict[str, Any]
) -> dict[str, bool]:
    """What must hold after `op` on a real vLLM, by name (all true for the step to pass)."""
    checks = {f"status {op.expect}": row.get("status") == op.expect}
    if op.expect == "refused":
        message = str(((row.get("answer") or {}).get("error") or {}).get("message"))
        checks["the refusal names host memory"] = "host memory" in message
        checks["nothing moved: READY"] = after.get("state") == "READY"
        return checks
    checks["memory measured (nvml) and passed"] = (
        row.get("memory_outcome") == "passed" and row.get("memory_source") == "nvml"
    )
    if op.path == "/v1/sleep" and op.body.get("level") == 1:
        host_ram = step_evidence(row, "precheck").get("host_ram") or {}
        backup = host_ram.get("backup") or {}
        checks["host RAM passed on the model files' size"] = (
            host_ram.get("outcome") == "passed"
            and backup.get("source") == "precheck_budget"
            and (backup.get("weights_bytes") or 0) > 0
        )
    if op.body.get("release_kv"):
        checks["sleep state names no offload or discard"] = (
            step_evidence(row, "verify").get("sleep_state") is None
        )
    if op.path == "/v1/wake" and (before.get("sleep") or {}).get("kv_released"):
        checks["prefix epoch moved"] = prefix_epoch(after) != prefix_epoch(before) and bool(
            step_evidence(row, "verify").get("prefix_cache")
        )
    if op.path == "/v1/reload":
        checks.update(reload_checks(row, before, after))
    if op.path.startswith("/v1/lora/"):
        checks.update(lora_checks(row))
    return checks


def lora_figures(row: dict[str, Any]) -> dict[str, Any]:
    """A LoRA operation's VERIFY figures: GPU memory (NVML) and KV blocks, before and after."""
    verify = step_evidence(row, "verify")
    memory, kv = verify.get("memory") or {}, verify.get("kv_capacity") or {}
    return {
        "memory": {k: memory.get(k) for k in ("outcome", "source", "reason", "before", "after")}
        | {k: memory[k] for k in ("growth_bytes", "freed_bytes", "load_growth_bytes") if k in memory},
        "kv_capacity": {k: kv.get(k) for k in ("outcome", "reason", "before", "after", "bound")},
    }


def lora_checks(row: dict[str, Any]) -> dict[str, bool]:
    """A LoRA load or unload on a real vLLM: memory measured through NVML and passed, KV capacity
    read from vllm:cache_config_info before and after, every block kept."""
    figures = row["lora"] = lora_figures(row)
    memory, kv = figures["memory"], figures["kv_capacity"]
    blocks = [(kv.get(k) or {}).get("num_gpu_blocks") for k in ("before", "after")]
    return {
        "VERIFY memory measured (nvml) and passed": memory.get("outcome") == "passed"
        and memory.get("source") == "nvml",
        "KV capacity read before and after, no block lost": kv.get("outcome") == "passed"
        and None not in blocks
        and blocks[0] == blocks[1],
    }


def reload_checks(row: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> dict[str, bool]:
    """A reload's identity on a real vLLM: every rank answered, the fingerprint read again, the KV
    capacity checked again on the size logged at start, the smoke a completion of the served model."""
    calls = step_evidence(row, "execute").get("calls") or []
    rpc = next((c["reload_weights"] for c in calls if "reload_weights" in c), None) or {}
    ranks = rpc.get("ranks") or []
    verify = step_evidence(row, "verify")
    identity = verify.get("identity") or {}
    fingerprint = identity.get("fingerprint") or {}
    files = str(identity.get("files"))
    was = (before.get("bundle") or {}).get("fingerprint")
    capacity = verify.get("kv_capacity") or {}
    at_start = (before.get("memory") or {}).get("kv_capacity") or {}
    smoke = verify.get("smoke") or {}
    return {
        "reload_weights answered for every rank": bool(ranks)
        and len(ranks) == rpc.get("world_size")
        and all(r.get("ok") for r in ranks),
        "fingerprint read again, unchanged files said so": fingerprint.get("from") == was
        and fingerprint.get("to") == (after.get("bundle") or {}).get("fingerprint")
        and (files.startswith("unchanged") or files.startswith("not_measured")),
        "KV capacity checked again on the start's logged size": capacity.get("outcome")
        in ("passed", "failed", "not_measured")
        and capacity.get("logged_tokens") == at_start.get("logged_tokens")
        and capacity.get("outcome") == at_start.get("outcome"),
        "smoke a completion of the served model": bool(smoke.get("text"))
        and smoke.get("model") == verify.get("model"),
    }


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


def run_operation(sup: str, op: Operation, cgroup: Path) -> dict[str, Any]:
    before = call(sup + "/v1/state")[1]
    set_host_room(cgroup, op.host_room)
    started = time.monotonic()
    try:
        status, answer = call(sup + op.path, "POST", op.body)
        row: dict[str, Any] = {"step": op.name, "path": op.path, "body": op.body}
        if status != 202:
            row.update(status="refused", answer=answer, engine_gib_after=engine_gib(before))
        else:
            while answer.get("status") == "running":
                time.sleep(0.5)
                answer = call(f"{sup}/v1/operations/{answer['operation_id']}")[1]
            state = call(sup + "/v1/state")[1]
            memory = (state.get("memory") or {}).get("last") or {}
            row.update(
                status=answer.get("status"),
                seconds=round(time.monotonic() - started, 2),
                memory_outcome=memory.get("outcome"),
                memory_source=memory.get("source"),
                memory_reason=memory.get("reason"),
                engine_gib_after=engine_gib(state),
                operation=answer,
            )
    finally:
        set_host_room(cgroup, None)
    after = call(sup + "/v1/state")[1]
    row["prefix_epoch"] = [prefix_epoch(before), prefix_epoch(after)]
    row["checks"] = step_checks(op, row, before, after)
    return row


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
    rows = [("step", "status", "memory", "source", "GiB per GPU (engine tree, NVML)", "checks")]
    ready = report.get("ready") or {}
    rows.append(
        ("READY", "-", str(ready.get("memory_outcome")), "-", json.dumps(ready.get("engine_gib")), "-")
    )
    for s in report["steps"]:
        gib = s.get("engine_gib_after")
        shown = ", ".join(f"{g[:12]} {v:.2f}" for g, v in gib.items()) if gib else str(gib)
        checks = s.get("checks") or {}
        failed = [name for name, held in checks.items() if not held]
        verdict = f"FAILED: {'; '.join(failed)}" if failed else (f"{len(checks)} ok" if checks else "-")
        rows.append(
            (
                s["step"],
                str(s["status"]),
                str(s.get("memory_outcome")),
                str(s.get("memory_source")),
                shown,
                verdict,
            )
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
    parser.add_argument(
        "--no-lora",
        action="store_true",
        help="Start the engine without --enable-lora and skip the LoRA load/unload memory check.",
    )
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
    state_dir = Path(tempfile.mkdtemp(prefix="gpu-sleep-cycle-"))
    host_room = state_dir / "host-room-cgroup"  # counted besides the engine's own cgroups
    set_host_room(host_room, None)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "CORRAL_MEMORY_CGROUP": str(host_room)}
    engine = [
        "vllm", "serve", args.model, "--host", "127.0.0.1", "--port", str(engine_port),
        "--enable-sleep-mode", "--gpu-memory-utilization", args.gpu_memory_utilization,
        "--max-model-len", args.max_model_len,
    ]  # fmt: skip
    operations = OPERATIONS
    lora_error: str | None = None
    if not args.no_lora:
        try:
            adapter = write_adapter(args.model, state_dir / "adapter")
        except Exception as exc:  # no config.json, no torch: say so, run the rest
            lora_error = f"no LoRA adapter could be written: {exc!r}"
            print(lora_error, file=sys.stderr)
        else:
            engine += ["--enable-lora", "--max-loras", "2", "--max-lora-rank", str(LORA_RANK)]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
            operations = OPERATIONS + lora_operations(adapter)
    floating = [] if Path(args.model).is_dir() else ["--allow-floating-revision"]
    report: dict[str, Any] = {
        "model": args.model,
        "gpus": [g.to_json() for g in gpus],
        "engine_command": engine,
        "lora": "skipped (--no-lora)" if args.no_lora else (lora_error or "load and unload checked"),
        "explain": explain(corral, floating, engine, env),
        "steps": [],
    }
    print(report["explain"]["output"])
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
        for op in operations:
            report["steps"].append(run_operation(sup, op, host_room))
            wait_state(sup, ("READY", "SLEEPING", "FAILED"), 300)
        report["verify"] = verify(corral, sup, state_dir / "verify.json")
        ok = (
            lora_error is None
            and len(report["steps"]) == len(operations)
            and all(all(s["checks"].values()) for s in report["steps"])
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
