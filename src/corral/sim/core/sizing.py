"""Sizing the simulated engine from its settings: the model's shape (a checkpoint directory or the default
for a name), one rank's weights and KV cache on the simulated device, and what vLLM would refuse.

Refusals are kept, not raised: the startup reports each at the phase where vLLM reports it (arguments
before anything loads, a CUDA OOM while loading, KV refusals after "Available KV cache memory").
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.sim.core.config import GIB, SimConfig
from corral.sim.core.device import MemoryPlan, SimulatedDevice, StartupMemoryError, plan_memory
from corral.sim.core.model_dir import ModelDirError, ModelShape, is_model_dir, read_model_dir

DEFAULT_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class EngineSizing:
    shape: ModelShape
    plan: MemoryPlan | None  # None when a refusal stops the start
    tensor_parallel_size: int = 1
    config_error: str | None = None  # vLLM's `ValueError: ...` at argument time
    memory_error: StartupMemoryError | None = None

    @property
    def weights_bytes(self) -> int:
        """One rank's weights (what "Model loading took" reports, even when the KV cache then fails)."""
        return self.shape.weights_bytes // self.tensor_parallel_size

    @property
    def kv_cache_bytes(self) -> int:
        return self.plan.kv_cache_bytes if self.plan is not None else 0


def default_max_model_len(model: str) -> int:
    """vLLM's default `--max-model-len`: the checkpoint's max_position_embeddings (2048 for a name)."""
    if is_model_dir(model):
        try:
            derived = read_model_dir(model).max_position_embeddings
        except ModelDirError:
            return DEFAULT_MAX_MODEL_LEN  # the startup reports the directory's problem
        if derived is not None:
            return derived
    return DEFAULT_MAX_MODEL_LEN


def _check_args(cfg: SimConfig, shape: ModelShape) -> str | None:
    derived = shape.max_position_embeddings
    if derived is not None and cfg.max_model_len > derived:
        return (
            f"User-specified max_model_len ({cfg.max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). To "
            "allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution."
        )
    tp = cfg.tensor_parallel_size
    if cfg.fail_rank is not None and not 0 <= cfg.fail_rank < tp:
        return (
            f"--fail-rank {cfg.fail_rank} is not a worker rank of --tensor-parallel-size {tp} "
            f"(ranks 0..{tp - 1}); worker processes exist only with --tensor-parallel-size 2 or more."
        )
    if cfg.unlogged_rank is not None and not 0 <= cfg.unlogged_rank < tp:
        return (
            f"--unlogged-rank {cfg.unlogged_rank} is not a worker rank of --tensor-parallel-size {tp} "
            f"(ranks 0..{tp - 1}); worker processes exist only with --tensor-parallel-size 2 or more."
        )
    return None


def size_engine(cfg: SimConfig) -> EngineSizing:
    """The shape, memory plan and any refusal of the engine `cfg` describes."""
    if is_model_dir(cfg.model):
        try:
            shape = read_model_dir(cfg.model)
        except ModelDirError as exc:
            return EngineSizing(ModelShape(), None, cfg.tensor_parallel_size, config_error=str(exc))
    else:
        # The default shape's 2 x 32 layers x 8 KV heads x 128 x bf16 is KV_BYTES_PER_TOKEN (128 KiB),
        # the figure the sim has always used for a name.
        shape = ModelShape(weights_bytes=cfg.weights_bytes)
    problem = _check_args(cfg, shape)
    if problem is not None:
        return EngineSizing(shape, None, cfg.tensor_parallel_size, config_error=problem)
    device = None
    if cfg.gpu_memory_gib is not None:
        device = SimulatedDevice(int(cfg.gpu_memory_gib * GIB), cfg.gpu_memory_utilization)
    override = int(cfg.kv_cache_gib * GIB) if cfg.kv_cache_gib is not None and device is None else None
    try:
        plan = plan_memory(
            shape,
            device,
            tensor_parallel_size=cfg.tensor_parallel_size,
            kv_dtype=shape.kv_dtype(cfg.dtype, cfg.kv_cache_dtype),
            block_size=cfg.block_size,
            max_model_len=cfg.max_model_len,
            kv_cache_blocks=cfg.kv_cache_blocks,
            kv_cache_bytes=override,
        )
    except StartupMemoryError as exc:
        return EngineSizing(shape, None, cfg.tensor_parallel_size, memory_error=exc)
    return EngineSizing(shape, plan, cfg.tensor_parallel_size)
