"""The simulated GPU's memory arithmetic: weights per rank, the KV cache that fits beside them, and vLLM's
own refusals when it does not (a CUDA OOM while loading, "No available memory for the cache blocks", "To
serve at least one request ...").

This is the simulator's copy on purpose: the supervisor's PRECHECK budget is an independent estimate,
checked against this one in tests. Per rank, as vLLM computes it (`gpu_worker.determine_available_memory`,
`kv_cache_utils`):

    available KV = utilization x device - weights / TP - OVERHEAD_BYTES
    KV bytes per token = 2 (K and V) x layers x max(1, kv_heads // TP) x head_dim x KV dtype bytes
    blocks = available KV // (block_size x KV bytes per token)

OVERHEAD_BYTES stands for what vLLM's profiling run adds to the weights: the activation peak, non-torch
allocations (NCCL buffers, cuBLAS workspace) and the CUDA graph pool; 1 GiB is a mid-size model's
figure at the default batch limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.sim.core.model_dir import DTYPE_BYTES, ModelShape

GIB = 2**30
OVERHEAD_BYTES = GIB
_CONSERVING_MEMORY = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def format_gib(n: float) -> str:
    """vLLM's `format_gib`: GiB rounded to two places, printed as Python prints the float."""
    return str(round(n / GIB, 2))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_bytes_per_token(shape: ModelShape, tensor_parallel_size: int, kv_dtype: str) -> int:
    """KV cache bytes one token takes on one rank: K and V of every layer for this rank's KV heads."""
    heads = max(1, shape.num_key_value_heads // tensor_parallel_size)
    return 2 * shape.num_hidden_layers * heads * shape.head_dim * DTYPE_BYTES[kv_dtype]


class StartupMemoryError(Exception):
    """The engine cannot start on this device; `str()` is vLLM's error line (`<Type>: <message>`)."""

    def __init__(self, line: str, during_load: bool, available_kv_bytes: int | None = None) -> None:
        super().__init__(line)
        self.during_load = during_load
        self.available_kv_bytes = available_kv_bytes  # logged before a KV refusal, as vLLM does


@dataclass(frozen=True)
class MemoryPlan:
    """What one rank holds once the engine is up; `available_kv_bytes` is None without a device."""

    weights_per_rank: int
    kv_bytes_per_token: int
    block_size: int
    max_model_len: int
    num_blocks: int
    available_kv_bytes: int | None = None
    kv_cache_bytes_override: int | None = None  # --kv-cache-gib, name-only models without a device

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_cache_bytes(self) -> int:
        """The KV cache allocation on one rank (blocks x block size x bytes per token)."""
        if self.kv_cache_bytes_override is not None:
            return self.kv_cache_bytes_override
        return self.kv_cache_tokens * self.kv_bytes_per_token

    @property
    def max_concurrency(self) -> float:
        """vLLM's figure: blocks / blocks one max-length request needs."""
        return self.num_blocks / _cdiv(self.max_model_len, self.block_size)


@dataclass(frozen=True)
class SimulatedDevice:
    """`--gpu-memory-gib` and `--gpu-memory-utilization`: the memory one rank's GPU offers."""

    total_bytes: int
    utilization: float = 0.9
    overhead_bytes: int = OVERHEAD_BYTES

    @property
    def requested_bytes(self) -> int:
        return int(self.total_bytes * self.utilization)

    def check_weights(self, shape: ModelShape, tensor_parallel_size: int) -> None:
        """Raise the CUDA OOM loading would hit when one rank's shards outgrow the whole device."""
        loaded = 0
        shards = shape.shards or (("model.safetensors", shape.weights_bytes),)
        for _name, size in shards:
            part = size // tensor_parallel_size
            if loaded + part > self.total_bytes:
                free = self.total_bytes - loaded
                raise StartupMemoryError(
                    f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {part / GIB:.2f} GiB. "
                    f"GPU 0 has a total capacity of {self.total_bytes / GIB:.2f} GiB of which "
                    f"{free / GIB:.2f} GiB is free. Including non-PyTorch memory, this process has "
                    f"{loaded / GIB:.2f} GiB memory in use. Of the allocated memory {loaded / GIB:.2f} GiB "
                    "is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If "
                    "reserved but unallocated memory is large try setting "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                    "documentation for Memory Management  "
                    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
                    during_load=True,
                )
            loaded += part

    def available_kv_bytes(self, weights_per_rank: int) -> int:
        """What is left for the KV cache after weights and overhead; negative when nothing is."""
        return self.requested_bytes - weights_per_rank - self.overhead_bytes

    @staticmethod
    def check_kv(available: int, bytes_per_token: int, block_size: int, max_model_len: int) -> int:
        """The number of KV blocks, or vLLM's ValueError when one max-length request does not fit."""
        if available <= 0:
            raise StartupMemoryError(
                "ValueError: No available memory for the cache blocks. Try increasing "
                f"`gpu_memory_utilization` when initializing the engine. {_CONSERVING_MEMORY}",
                during_load=False,
                available_kv_bytes=available,
            )
        block_bytes = block_size * bytes_per_token
        needed = _cdiv(max_model_len, block_size) * block_bytes
        if needed > available:
            estimated = min(max_model_len, available // block_bytes * block_size)
            estimate = (
                f"Based on the available memory, the estimated maximum model length is {estimated}. "
                if estimated > 0
                else ""
            )
            raise StartupMemoryError(
                "ValueError: To serve at least one request with the models's max seq len "
                f"({max_model_len}), ({format_gib(needed)} GiB KV cache is needed, which is larger than "
                f"the available KV cache memory ({format_gib(available)} GiB). {estimate}Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. "
                f"{_CONSERVING_MEMORY}",
                during_load=False,
                available_kv_bytes=available,
            )
        return available // block_bytes


def plan_memory(
    shape: ModelShape,
    device: SimulatedDevice | None,
    *,
    tensor_parallel_size: int,
    kv_dtype: str,
    block_size: int,
    max_model_len: int,
    kv_cache_blocks: int,
    kv_cache_bytes: int | None = None,
) -> MemoryPlan:
    """One rank's weights and KV cache; without a device, `kv_cache_blocks` as given (no arithmetic).

    Raises `StartupMemoryError` with vLLM's message when the device cannot hold the engine.
    """
    weights = shape.weights_bytes // tensor_parallel_size
    per_token = kv_bytes_per_token(shape, tensor_parallel_size, kv_dtype)
    if device is None:
        return MemoryPlan(
            weights, per_token, block_size, max_model_len, kv_cache_blocks, None, kv_cache_bytes
        )
    device.check_weights(shape, tensor_parallel_size)
    available = device.available_kv_bytes(weights)
    blocks = device.check_kv(available, per_token, block_size, max_model_len)
    return MemoryPlan(weights, per_token, block_size, max_model_len, blocks, available)
