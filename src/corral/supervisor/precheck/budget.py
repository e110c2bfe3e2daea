"""PRECHECK's memory budget: per rank, the weights, the KV cache of at least one `--max-model-len`
sequence and a documented headroom against `--gpu-memory-utilization` × the smallest GPU, the way
vLLM sizes its KV cache at startup; a start that cannot fit is refused naming the line and the
shortfall.

Headroom is an estimate (vLLM measures it only while loading), one named line each, per rank:
- activation peak 1.25 GiB: vLLM's profile run, "PyTorch activation peak memory 1.26GiB" for
  Llama-3-8B on an H100 (vllm-project/vllm#10511); it grows with --max-num-batched-tokens and for
  vision encoders (36 GiB at 64k context in #12126).
- non-torch 0.25 GiB: CUDA context and cuBLAS workspace outside PyTorch's allocator ("non_torch_memory
  takes 0.16GiB" in #12126, 0.20 GiB in #14447).
- CUDA graphs 0.50 GiB, none with --enforce-eager: captured after the KV cache is allocated (vLLM
  logs "Graph capturing finished in N secs, took 0.4–0.6 GiB" for 7–8B models).
- NCCL 0.50 GiB when the engine has more than one rank: all-reduce buffers, from 0.20 GiB (#14447,
  TP 4) to 1.79 GiB (#10511, TP 2 on an H100).
`--headroom-gib G` replaces the four with one declared figure.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.engine.flags import flag_value
from corral.engine.model_config import (
    KV_BLOCK_TOKENS,
    ModelConfig,
    ModelConfigError,
    WeightFiles,
    kv_dtype_bytes,
    read_model_config,
    served_dtype,
    weight_files,
)
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.engine_args import (
    EngineArgError,
    check_context,
    max_model_len,
    model_directory,
    utilization,
)
from corral.supervisor.precheck.explain import Step, gib, step_lines
from corral.supervisor.precheck.inventory import GpuInventory
from corral.supervisor.precheck.parallel import ParallelLayout, parallel_layout

NAME = "memory_budget"
GIB = 1 << 30
ACTIVATION_PEAK_BYTES = int(1.25 * GIB)
NON_TORCH_BYTES = int(0.25 * GIB)
CUDA_GRAPH_BYTES = int(0.50 * GIB)
NCCL_BYTES = int(0.50 * GIB)


@dataclass(frozen=True)
class BudgetOverrides:
    """What the supervisor declares for the budget: `--weights-gib` (the checkpoint's size, for a hub
    id or when the files overstate what is loaded) and `--headroom-gib` (replaces the estimates)."""

    weights_bytes: int | None = None
    headroom_bytes: int | None = None

    def __post_init__(self) -> None:
        for flag, value in (("--weights-gib", self.weights_bytes), ("--headroom-gib", self.headroom_bytes)):
            if value is not None and value < 0:
                raise ValueError(f"{flag} {value / GIB:g}: give a size in GiB, ≥ 0")


@dataclass(frozen=True)
class Budget:
    """One rank's memory arithmetic; a figure is None where nothing here could measure it."""

    layout: ParallelLayout
    utilization: float
    weights_bytes_per_rank: int | None
    kv_bytes_per_token: int | None
    min_kv_tokens: int | None
    headroom_bytes: int
    usable_bytes: int | None
    device_bytes: int | None = None  # the smallest GPU's total memory
    free_bytes: int | None = None
    steps: tuple[Step, ...] = field(default=())

    @property
    def min_kv_bytes(self) -> int | None:
        """KV for one `--max-model-len` sequence, in whole blocks as vLLM allocates it."""
        if self.kv_bytes_per_token is None or self.min_kv_tokens is None:
            return None
        return math.ceil(self.min_kv_tokens / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS * self.kv_bytes_per_token

    @property
    def kv_budget_bytes(self) -> int | None:
        """What vLLM would give the KV cache: usable − weights − headroom."""
        if self.usable_bytes is None or self.weights_bytes_per_rank is None:
            return None
        return self.usable_bytes - self.weights_bytes_per_rank - self.headroom_bytes

    @property
    def expected_kv_tokens(self) -> int | None:
        """The KV cache size vLLM should log ("KV cache size: N tokens"): the budget in whole blocks."""
        budget, per_token = self.kv_budget_bytes, self.kv_bytes_per_token
        if budget is None or per_token is None:
            return None
        return max(0, budget // (per_token * KV_BLOCK_TOKENS)) * KV_BLOCK_TOKENS

    def to_evidence(self) -> dict[str, Any]:
        return {
            **self.layout.to_json(),
            "gpu_memory_utilization": self.utilization,
            "weights_bytes_per_rank": self.weights_bytes_per_rank,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "min_kv_tokens": self.min_kv_tokens,
            "min_kv_bytes": self.min_kv_bytes,
            "headroom_bytes": self.headroom_bytes,
            "usable_bytes": self.usable_bytes,
            "free_bytes": self.free_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "expected_kv_tokens": self.expected_kv_tokens,
            "lines": step_lines(self.steps),
        }


def _headroom(
    argv: Sequence[str], layout: ParallelLayout, overrides: BudgetOverrides
) -> list[tuple[Step, int]]:
    """The headroom lines and their bytes: the declared figure, or the four estimates."""
    if overrides.headroom_bytes is not None:
        declared = overrides.headroom_bytes
        return [(Step("headroom", gib(declared), "--headroom-gib (replaces the estimates)"), declared)]
    flags = [a for a in argv if a in ("--enforce-eager", "--no-enforce-eager")]
    eager = bool(flags) and flags[-1] == "--enforce-eager"
    ranks = layout.tensor * layout.pipeline
    graphs = 0 if eager else CUDA_GRAPH_BYTES
    nccl = NCCL_BYTES if ranks > 1 else 0
    return [
        (
            Step("activation peak", gib(ACTIVATION_PEAK_BYTES), "estimate: vLLM's profile run (vllm#10511)"),
            ACTIVATION_PEAK_BYTES,
        ),
        (
            Step("non-torch", gib(NON_TORCH_BYTES), "estimate: CUDA context, cuBLAS workspace (vllm#12126)"),
            NON_TORCH_BYTES,
        ),
        (
            Step(
                "CUDA graphs",
                gib(graphs),
                "--enforce-eager: none captured" if eager else "estimate: graph capture of a 7–8B model",
            ),
            graphs,
        ),
        (
            Step(
                "NCCL",
                gib(nccl),
                f"estimate: all-reduce buffers of {ranks} ranks" if ranks > 1 else "one rank: no collectives",
            ),
            nccl,
        ),
    ]


def _weights(
    model: str | None, files: WeightFiles | None, layout: ParallelLayout, overrides: BudgetOverrides
) -> tuple[int | None, Step]:
    shards = layout.tensor * layout.pipeline
    split = f" ÷ (TP {layout.tensor} × PP {layout.pipeline})" if shards > 1 else ""
    if overrides.weights_bytes is not None:
        seen = f"; files: {gib(files.total_bytes)}" if files is not None else ""
        per_rank = overrides.weights_bytes // shards
        return per_rank, Step(
            "weights/rank", gib(per_rank), f"--weights-gib {gib(overrides.weights_bytes)}{split}{seen}"
        )
    if files is not None:
        per_rank = files.total_bytes // shards
        how = f"{gib(files.total_bytes)} in {len(files.files)} {files.pattern}{split}"
        return per_rank, Step("weights/rank", gib(per_rank), how)
    why = f"{model}: no weight files on this host" if model else "no --model in the engine command"
    return None, Step("weights/rank", "?", f"not measured ({why}); declare --weights-gib")


def compute_budget(
    argv: Sequence[str],
    inventory: GpuInventory | None,
    overrides: BudgetOverrides,
    environ: Mapping[str, str],
) -> Budget:
    """The arithmetic for `argv` on `inventory`; EngineArgError or ModelConfigError for input the
    engine would refuse too."""
    layout = parallel_layout(argv)
    fraction = utilization(argv)
    model, model_dir = model_directory(argv, environ)
    config: ModelConfig | None = read_model_config(model_dir) if model_dir is not None else None
    files = weight_files(model_dir) if model_dir is not None else None
    weights, weights_step = _weights(model, files, layout, overrides)
    steps = [weights_step]
    per_token: int | None = None
    tokens: int | None = None
    if config is not None:
        dtype = served_dtype(flag_value(argv, "--dtype"), config.dtype)
        kv_cache_dtype = flag_value(argv, "--kv-cache-dtype")
        element = kv_dtype_bytes(kv_cache_dtype, dtype)
        per_token = config.kv_bytes_per_token(element, layout.tensor, layout.pipeline)
        steps.append(
            Step(
                "KV/token/rank",
                f"{per_token:,} B",
                config.kv_formula(element, layout.tensor, layout.pipeline),
            )
        )
        given = flag_value(argv, "--max-model-len")
        if given is not None:
            tokens, source = max_model_len(given), "--max-model-len"
            check_context(tokens, config, environ)
        else:
            tokens, source = config.max_position_embeddings, "config.json max_position_embeddings"
        if tokens is None:
            tokens, source = KV_BLOCK_TOKENS, "one block: vLLM fits the context to memory"
        blocks = math.ceil(tokens / KV_BLOCK_TOKENS)
        steps.append(
            Step(
                "KV 1 sequence",
                gib(blocks * KV_BLOCK_TOKENS * per_token),
                f"{tokens:,} tokens ({source}) in {blocks:,} blocks of {KV_BLOCK_TOKENS} × {per_token:,} B",
            )
        )
    else:
        steps.append(Step("KV/token/rank", "?", "not measured: no config.json on this host"))
    headroom = _headroom(argv, layout, overrides)
    headroom_bytes = sum(value for _, value in headroom)
    steps.extend(step for step, _ in headroom)
    usable: int | None = None
    free: int | None = None
    device_bytes: int | None = None
    used = inventory.devices[: layout.world_size] if inventory is not None and inventory.memory_known else ()
    if inventory is not None and used:
        device = min(used, key=lambda d: d.total_bytes)
        device_bytes = device.total_bytes
        usable = int(fraction * device_bytes)
        steps.append(
            Step(
                "usable/rank",
                gib(usable),
                f"--gpu-memory-utilization {fraction:g} × {gib(device.total_bytes)} (GPU {device.index}, "
                + (f"{device.model}, " if device.model != inventory.source else "")
                + f"{inventory.source})",
            )
        )
        frees = [d.free_bytes for d in used if d.free_bytes is not None]
        free = min(frees) if frees else None
    else:
        steps.append(Step("usable/rank", "?", "not measured: no GPU inventory (NVML, --gpu-memory-gib)"))
    if usable is not None and weights is not None:
        kv_budget = usable - weights - headroom_bytes
        steps.append(
            Step(
                "KV budget",
                gib(kv_budget),
                f"usable {gib(usable)} − weights {gib(weights)} − headroom {gib(headroom_bytes)}",
            )
        )
        if per_token is not None:
            expected = max(0, kv_budget // (per_token * KV_BLOCK_TOKENS)) * KV_BLOCK_TOKENS
            steps.append(
                Step(
                    "expected KV tokens",
                    f"{expected:,}",
                    f"{gib(kv_budget)} ÷ {per_token:,} B, whole blocks of {KV_BLOCK_TOKENS}",
                )
            )
    return Budget(
        layout, fraction, weights, per_token, tokens, headroom_bytes, usable, device_bytes, free, tuple(steps)
    )


def _refusal(budget: Budget) -> str | None:
    """What does not fit, by how much, and what to do; None when everything measured fits."""
    usable = budget.usable_bytes
    if usable is None:
        return None
    terms: list[tuple[str, int]] = []
    if budget.weights_bytes_per_rank is not None:
        terms.append(("weights", budget.weights_bytes_per_rank))
    if budget.min_kv_bytes is not None:
        terms.append(("KV 1 seq", budget.min_kv_bytes))
    terms.append(("headroom", budget.headroom_bytes))
    need = sum(value for _, value in terms)
    if need <= usable:
        if budget.free_bytes is not None and budget.free_bytes < usable:
            return (
                f"free memory on the device ({gib(budget.free_bytes)}) is less than the desired "
                f"--gpu-memory-utilization {budget.utilization:g} ({gib(usable)}): another process holds GPU "
                "memory; stop it or lower --gpu-memory-utilization"
            )
        return None
    sum_text = " + ".join(
        f"{name} {gib(value)}" + ("/rank" if name == "weights" else "") for name, value in terms
    )
    device = f"{budget.utilization:.2f} × {gib(budget.device_bytes or 0)}"
    head = f"{sum_text} = {gib(need)} > {device} = {gib(usable)} by {gib(need - usable)}"
    weights = budget.weights_bytes_per_rank or 0
    if weights > usable:
        return (
            f"{head}: the weights alone ({gib(weights)}/rank) do not fit; shard them over more GPUs "
            "(--tensor-parallel-size), quantize, or use larger GPUs"
        )
    left = usable - weights - budget.headroom_bytes
    if left <= 0 or budget.kv_bytes_per_token is None:
        return (
            f"{head}: no memory left for the KV cache; raise --gpu-memory-utilization or shard over more GPUs"
        )
    longest = left // (budget.kv_bytes_per_token * KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    return (
        f"{head}: KV for one {budget.min_kv_tokens:,}-token sequence needs {gib(budget.min_kv_bytes or 0)}, "
        f"{gib(left)} is left; the longest context that fits is {longest:,} tokens: lower --max-model-len, "
        "use --kv-cache-dtype fp8, or raise --gpu-memory-utilization"
    )


def memory_budget(
    argv: Sequence[str],
    inventory: GpuInventory | None,
    overrides: BudgetOverrides | None = None,
    environ: Mapping[str, str] | None = None,
) -> CheckResult:
    """The budget as a PRECHECK check: refused when a measured line does not fit (the reason names it
    and the shortfall), not_measured when the GPU or the model could not be read and nothing
    measured already overflows, else passed. Evidence: `Budget.to_evidence()`."""
    env = os.environ if environ is None else environ
    try:
        budget = compute_budget(argv, inventory, overrides or BudgetOverrides(), env)
    except (EngineArgError, ModelConfigError) as exc:
        return CheckResult(NAME, Outcome.REFUSED, f"{exc}; fix it before the start")
    evidence = budget.to_evidence()
    refusal = _refusal(budget)
    if refusal is not None:
        return CheckResult(NAME, Outcome.REFUSED, refusal, evidence)
    missing = [
        what
        for what, value in (
            ("GPU memory", budget.usable_bytes),
            ("weights", budget.weights_bytes_per_rank),
            ("KV per token", budget.kv_bytes_per_token),
        )
        if value is None
    ]
    if missing:
        return CheckResult(
            NAME, Outcome.NOT_MEASURED, f"not measured: {', '.join(missing)} unknown here", evidence
        )
    return CheckResult(
        NAME,
        Outcome.PASSED,
        f"weights {gib(budget.weights_bytes_per_rank or 0)}/rank + KV 1 seq "
        f"{gib(budget.min_kv_bytes or 0)} + headroom {gib(budget.headroom_bytes)} fit in "
        f"{gib(budget.usable_bytes or 0)}; KV budget {gib(budget.kv_budget_bytes or 0)} ≈ "
        f"{budget.expected_kv_tokens:,} tokens",
        evidence,
    )
