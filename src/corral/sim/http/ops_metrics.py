"""Metrics of the operational features: simulated memory and weight state (`corral_sim_*`, which vLLM does
not have; a real deployment reads GPU memory from DCGM or nvidia-smi) and vLLM's `vllm:lora_requests_info`.

All are read at scrape time from the lifecycle, the load outcome and the LoRA registry.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from corral.engine.metric_names import LORA_INFO, LORA_RUNNING_LABEL, LORA_WAITING_LABEL
from corral.sim.core.lifecycle import EngineLifecycle
from corral.sim.core.lora import LoraRegistry
from corral.sim.weights.weight_loader import LoadOutcome


class LifecycleCollector(Collector):
    def __init__(
        self, model_name: str, lifecycle: EngineLifecycle, load: LoadOutcome, memory: bool = True
    ) -> None:
        self._labels = {"engine": "0", "model_name": model_name}
        self._lifecycle = lifecycle
        self.load = load
        self._memory = memory  # False (--no-memory-metrics): no memory gauges, as vLLM

    def collect(self) -> Iterator[Metric]:
        lc, labels = self._lifecycle, self._labels
        if self._memory:
            yield from self._memory_gauges()
        paused = Metric(
            "corral_sim_scheduler_paused", "1 while the scheduler is paused (sleep, pause).", "gauge"
        )
        paused.add_sample(paused.name, labels, 1.0 if lc.is_paused else 0.0)
        yield paused
        info = Metric(
            "corral_sim_weight_load",
            "How the weights were loaded at startup: source disk, ipc_cache (from the preload daemon) or "
            "disk_fallback (daemon unusable); mode is the ipc_cache mode.",
            "gauge",
        )
        info.add_sample(info.name, {**labels, "source": self.load.source, "mode": self.load.mode}, 1.0)
        yield info

    def _memory_gauges(self) -> Iterator[Metric]:
        lc, labels = self._lifecycle, self._labels
        mem = lc.memory()
        gpu = Metric(
            "corral_sim_gpu_memory_bytes",
            "Simulated GPU memory the engine holds, by kind (weights, kv_cache); moves with sleep and wake.",
            "gauge",
        )
        gpu.add_sample(gpu.name, {**labels, "kind": "weights"}, mem.gpu_weights)
        gpu.add_sample(gpu.name, {**labels, "kind": "kv_cache"}, mem.gpu_kv_cache)
        yield gpu
        cpu = Metric(
            "corral_sim_cpu_backup_bytes",
            "Simulated host memory holding the weights' backup (sleep level 1).",
            "gauge",
        )
        cpu.add_sample(cpu.name, labels, mem.cpu_backup)
        yield cpu
        valid = Metric(
            "corral_sim_weights_valid",
            "1 when the weight memory holds the model; 0 after a level-2 wake without reload_weights "
            "(requests are then answered with garbage).",
            "gauge",
        )
        valid.add_sample(valid.name, labels, 1.0 if lc.weights_valid else 0.0)
        yield valid


class LoraCollector(Collector):
    """`vllm:lora_requests_info`: one series per label set seen, valued with when it was last current."""

    def __init__(self, registry: LoraRegistry) -> None:
        self._registry = registry
        self._seen: dict[tuple[str, str], float] = {}

    def collect(self) -> Iterator[Metric]:
        reg = self._registry
        current = (",".join(reg.running_names()), ",".join(reg.waiting_names()))
        self._seen[current] = time.time()
        m = Metric(LORA_INFO, "Running stats on lora requests.", "gauge")
        for (running, waiting), stamp in self._seen.items():
            m.add_sample(
                m.name,
                {
                    "max_lora": str(reg.max_loras),
                    LORA_RUNNING_LABEL: running,
                    LORA_WAITING_LABEL: waiting,
                },
                stamp,
            )
        yield m
