"""The CUDA-graph and NCCL settings of an engine command and its environment, and how two bundles'
differ: what the runbook's diagnosis tree asks of a GPU fault ("main-only graph/NCCL flags vs stable
version"). A bundle that fails with a CUDA or NCCL error where the stable one served is first suspected
of what it changed here: CUDA graphs on or captured differently, the custom all-reduce, the parallel
layout, NCCL's transport settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# vLLM flags that decide CUDA graphs and collectives (a short form maps to its long one)
_GRAPH_NCCL_FLAGS = {
    "--enforce-eager": "--enforce-eager",
    "--compilation-config": "--compilation-config",
    "-cc": "--compilation-config",
    "-O": "-O",
    "--cuda-graph-sizes": "--cuda-graph-sizes",
    "--max-cudagraph-capture-size": "--max-cudagraph-capture-size",
    "--max-seq-len-to-capture": "--max-seq-len-to-capture",
    "--disable-custom-all-reduce": "--disable-custom-all-reduce",
    "--distributed-executor-backend": "--distributed-executor-backend",
    "--all2all-backend": "--all2all-backend",
    "--enable-expert-parallel": "--enable-expert-parallel",
    "-ep": "--enable-expert-parallel",
    "--tensor-parallel-size": "--tensor-parallel-size",
    "-tp": "--tensor-parallel-size",
    "--pipeline-parallel-size": "--pipeline-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "--data-parallel-size": "--data-parallel-size",
    "-dp": "--data-parallel-size",
}
_SWITCHES = frozenset({"--enforce-eager", "--disable-custom-all-reduce", "--enable-expert-parallel"})
# environment names: NCCL's own, torch's NCCL ones, the CUDA allocator, and vLLM's graph/collective ones
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_", "PYTORCH_CUDA_ALLOC_CONF")
_VLLM_ENV_WORDS = (
    "NCCL",
    "GRAPH",
    "ALLREDUCE",
    "ALL_REDUCE",
    "ALL2ALL",
    "COMPILE",
    "SYMM_MEM",
    "P2P",
    "CUMEM",
)
UNSET = "(unset)"
_VALUE_CHARS = 200


def _flag_name(arg: str) -> tuple[str, str | None] | None:
    """The canonical flag an argument names (`--compilation-config.cudagraph_mode=FULL` included), and
    its `=` value; None for an argument that is no graph/NCCL flag."""
    name, eq, value = arg.partition("=")
    base, dot, sub = name.partition(".")
    canonical = _GRAPH_NCCL_FLAGS.get(base)
    if canonical is None:
        return None
    return (canonical + (f".{sub}" if dot else ""), value if eq else None)


def graph_nccl_settings(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """Every graph/NCCL flag of the command (a switch is "on") and environment name, with its value."""
    settings: dict[str, str] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        named = _flag_name(arg)
        if named is None:
            continue
        name, value = named
        if value is None:
            if name in _SWITCHES:
                value = "on"
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                value = args[i + 1]
            else:
                value = "on"
        settings[name] = value[:_VALUE_CHARS]
    for key, value in env.items():
        vllm = key.startswith("VLLM_") and any(word in key for word in _VLLM_ENV_WORDS)
        if vllm or key.startswith(_ENV_PREFIXES):
            settings[key] = str(value)[:_VALUE_CHARS]
    return settings


@dataclass(frozen=True)
class SettingChange:
    """One graph/NCCL setting that differs: its value in the failing bundle and in the stable one."""

    name: str
    here: str
    stable: str

    def words(self) -> str:
        return f"{self.name} {self.here} (stable: {self.stable})"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "here": self.here, "stable": self.stable}


def changed_settings(here: Mapping[str, str], stable: Mapping[str, str]) -> list[SettingChange]:
    """The settings whose values differ (a setting only one side has is `UNSET` on the other)."""
    return [
        SettingChange(name, here.get(name, UNSET), stable.get(name, UNSET))
        for name in sorted(set(here) | set(stable))
        if here.get(name) != stable.get(name)
    ]


def bundle_settings(bundle: Mapping[str, Any]) -> dict[str, str]:
    """The graph/NCCL settings of a bundle as records keep it (`command`, `engine_args`, `env`): what the
    bundle sets, not the base command it adds to (a record does not know that one)."""
    argv = [str(a) for a in (*(bundle.get("command") or ()), *(bundle.get("engine_args") or ()))]
    env = bundle.get("env") or {}
    return graph_nccl_settings(argv, {str(k): str(v) for k, v in dict(env).items()})


def comparison(
    bundle: str, here: Mapping[str, str], stable_bundle: str, stable: Mapping[str, str]
) -> dict[str, Any]:
    """What /v1/state shows: the running bundle's graph/NCCL settings against the stable bundle's."""
    return {
        "bundle": bundle,
        "stable_bundle": stable_bundle,
        "changed": [c.to_json() for c in changed_settings(here, stable)],
    }
