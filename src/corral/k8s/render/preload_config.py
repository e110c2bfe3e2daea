"""`preload:` in corral.yaml (issue 29 item 5): vLLM's weight-cache daemon (`vllm preload`) in every
engine pod, as the supervisor's second child (`corral supervise --preload-command … --preload-health …`):
started before the engine, the engine started only once its `/health` answers 200, stopped after the
engine, watched (its death and its ranks', `corral.supervisor.lifecycle.preload*`). It is in the engine's
container, not a sidecar: it must see the same GPUs, run the same vLLM (its cache key holds the version,
so one image carries both and a new image upgrades both together, the daemon first) and share the
socket directory (vLLM's default, /tmp/vllm_weight_cache_<uid>, in the pod's /tmp).

The daemon's command repeats what the cache key compares (model, revision, TP, and from engine.args the
dtype, quantization, data parallelism and expert parallelism); the engine gets `--load-format ipc_cache`
and `--model-loader-extra-config {"mode", "fallback"}`. Refused: pipeline parallelism (vLLM 0.31's daemon
refuses PP), `zero_copy` with sleep mode (the daemon owns the weights; the engine's allocator cannot back
them up or free them), and a --load-format of the engine's own.
"""

from __future__ import annotations

import json
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# engine flags the daemon's cache key compares, copied from engine.args to the daemon's command
KEY_FLAGS = frozenset({"--dtype", "--quantization", "-q", "--data-parallel-size", "-dp"})
KEY_SWITCHES = frozenset({"--enable-expert-parallel", "--trust-remote-code"})
HEALTH_HOST = "127.0.0.1"


class PreloadSpec(BaseModel):
    """vLLM's weight-cache daemon (`vllm preload`) in each engine pod's container, run by the supervisor
    before the engine (which loads `--load-format ipc_cache`) and stopped after it; its command repeats the
    engine's model, revision, TP, dtype, quantization, DP and EP. Its load counts against
    dependencies' deadline (the supervisor waits for its /health like a --wait-for)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="run vLLM's weight-cache daemon in every engine pod")
    mode: Literal["zero_copy", "copy"] = Field(
        default="zero_copy",
        description="zero_copy: the engine maps the daemon's GPU memory (no sleep mode); copy: it copies "
        "the weights and the daemon releases its own",
    )
    fallback: bool = Field(
        default=True,
        description="an engine that cannot use the daemon loads from disk (a counted, alerted event) "
        "instead of failing",
    )
    health_port: int = Field(
        default=8100, ge=1, le=65535, description="the daemon's /health, on the pod's loopback"
    )


def key_args(engine_args: list[str]) -> list[str]:
    """The flags of `engine_args` the daemon's cache key compares (with their values)."""
    out: list[str] = []
    i = 0
    while i < len(engine_args):
        arg = engine_args[i]
        flag = arg.split("=", 1)[0]
        if arg in KEY_SWITCHES:
            out.append(arg)
        elif flag in KEY_FLAGS:
            if "=" in arg:
                out.append(arg)
            elif i + 1 < len(engine_args):
                out += [arg, engine_args[i + 1]]
                i += 1
        i += 1
    return out


def problems(spec: PreloadSpec, engine_args: list[str], pipeline_parallel_size: int) -> list[str]:
    """Why this engine cannot run beside the daemon (empty: it can)."""
    if not spec.enabled:
        return []
    found: list[str] = []
    if pipeline_parallel_size > 1:
        found.append(
            f"engine.pipeline_parallel_size {pipeline_parallel_size}: vLLM's weight-cache daemon serves "
            "no pipeline parallelism; set it to 1 or turn preload off"
        )
    flags = {a.split("=", 1)[0] for a in engine_args}
    if spec.mode == "zero_copy" and "--enable-sleep-mode" in flags:
        found.append(
            "preload.mode zero_copy with --enable-sleep-mode in engine.args: the daemon owns the weights, "
            "so the engine cannot back them up or free them; use preload.mode copy or drop sleep mode"
        )
    for owned in ("--load-format", "--model-loader-extra-config"):
        if owned in flags:
            found.append(
                f"{owned} in engine.args is set by preload; remove it (preload.mode, preload.fallback)"
            )
    return found


def daemon_argv(
    spec: PreloadSpec,
    model_path: str,
    revision: str | None,
    tensor_parallel_size: int,
    engine_args: list[str],
) -> list[str]:
    return [
        "vllm",
        "preload",
        "--model",
        model_path,
        *([] if revision is None else ["--revision", revision]),
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        *key_args(engine_args),
        "--weight-cache-health-port",
        str(spec.health_port),
        "--weight-cache-health-host",
        HEALTH_HOST,
    ]


def engine_loader_args(spec: PreloadSpec) -> list[str]:
    if not spec.enabled:
        return []
    config = json.dumps({"mode": spec.mode, "fallback": spec.fallback}, separators=(",", ":"))
    return ["--load-format", "ipc_cache", "--model-loader-extra-config", config]


def supervisor_preload_args(
    spec: PreloadSpec,
    model_path: str,
    revision: str | None,
    tensor_parallel_size: int,
    engine_args: list[str],
) -> list[str]:
    if not spec.enabled:
        return []
    command = shlex.join(daemon_argv(spec, model_path, revision, tensor_parallel_size, engine_args))
    return [
        "--preload-command",
        command,
        "--preload-health",
        f"http://{HEALTH_HOST}:{spec.health_port}/health",
    ]
