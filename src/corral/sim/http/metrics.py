"""The engine's Prometheus metrics under vLLM's names, labels, help texts and histogram buckets.

Counters and histograms live in `corral.sim.core.stats.EngineStats` (plain numbers, cheap to update per
request); gauges are read from the scheduler and prefix cache at scrape time by `EngineCollector`, so
nothing is updated per token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from corral.engine import metric_names as vllm
from corral.sim.core.prefix_cache import PrefixCache
from corral.sim.core.scheduler import Scheduler
from corral.sim.core.stats import FINISHED_REASONS, EngineStats, Histogram

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"


def _fmt_le(bound: float) -> str:
    return repr(float(bound))


def histogram_family(name: str, doc: str, labels: dict[str, str], hist: Histogram) -> Metric:
    """A histogram family as vLLM exposes one: cumulative `_bucket`s with `le` (labels in name order),
    `_count`, `_sum` and `_created`."""

    def labelled(**extra: str) -> dict[str, str]:
        return dict(sorted({**labels, **extra}.items()))

    m = Metric(name, doc, "histogram")
    cumulative = 0
    for bound, n in zip(hist.buckets, hist.counts, strict=False):
        cumulative += n
        m.add_sample(name + "_bucket", labelled(le=_fmt_le(bound)), cumulative)
    m.add_sample(name + "_bucket", labelled(le="+Inf"), hist.count)
    m.add_sample(name + "_count", labelled(), hist.count)
    m.add_sample(name + "_sum", labelled(), hist.sum)
    m.add_sample(name + "_created", labelled(), hist.created)
    return m


# vLLM 0.33's `vllm:cache_config_info` labels (tests/data/vllm-samples/metrics.body) with its defaults;
# the engine's own values (`SimServer.cache_config`) and the live block count replace some
CACHE_CONFIG_LABELS = {
    "_block_size_resolved": "True",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


class EngineCollector(Collector):
    """Yields the `vllm:` families for one engine (`engine="0"`) serving `model_name`."""

    def __init__(
        self,
        model_name: str,
        stats: EngineStats,
        scheduler: Scheduler,
        cache: PrefixCache,
        sleep_state: Callable[[], str | None] = lambda: "awake",
        cache_config: Mapping[str, str] | None = None,
    ) -> None:
        self._model = model_name
        self._cache_config = dict(cache_config or {})
        self._stats = stats
        self._scheduler = scheduler
        self._cache = cache
        self._sleep_state = sleep_state

    def _labels(self, **extra: str) -> dict[str, str]:
        labels = {"engine": "0", "model_name": self._model, **extra}
        return dict(sorted(labels.items()))

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        m = Metric(name, doc, "gauge")
        m.add_sample(name, self._labels(), value)
        return m

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        m = Metric(name, doc, "counter")
        m.add_sample(name + "_total", self._labels(), value)
        m.add_sample(name + "_created", self._labels(), self._stats.created)
        return m

    def _histogram(self, name: str, doc: str, hist: Histogram) -> Metric:
        return histogram_family(name, doc, self._labels(), hist)

    def collect(self) -> Iterator[Metric]:
        s, sched, cache = self._stats, self._scheduler, self._cache
        yield self._gauge(vllm.RUNNING, "Number of requests in model execution batches.", sched.num_running)
        yield self._gauge(vllm.WAITING, "Number of requests waiting to be processed.", sched.num_waiting)
        by_reason = Metric(
            vllm.WAITING_BY_REASON,
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            "gauge",
        )
        by_reason.add_sample(by_reason.name, self._labels(reason="capacity"), sched.num_waiting)
        by_reason.add_sample(by_reason.name, self._labels(reason="deferred"), 0)
        yield by_reason
        sleep = Metric(
            vllm.SLEEP_STATE,
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "gauge",
        )
        state = self._sleep_state()
        for label in ("awake", "weights_offloaded", "discard_all"):
            sleep.add_sample(sleep.name, self._labels(sleep_state=label), 1.0 if state == label else 0.0)
        yield sleep
        yield self._gauge(vllm.KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", sched.kv_usage)
        yield self._cache_config_info(sched)
        yield self._counter(
            vllm.family(vllm.PREFIX_CACHE_QUERIES),
            "Prefix cache queries, in terms of number of queried tokens.",
            cache.queries,
        )
        yield self._counter(
            vllm.family(vllm.PREFIX_CACHE_HITS),
            "Prefix cache hits, in terms of number of cached tokens.",
            cache.hits,
        )
        yield self._counter(
            vllm.family(vllm.PREEMPTIONS), "Cumulative number of preemption from the engine.", s.preemptions
        )
        yield self._counter(
            vllm.family(vllm.PROMPT_TOKENS), "Number of prefill tokens processed.", s.prompt_tokens
        )
        by_source = Metric(
            vllm.family(vllm.PROMPT_TOKENS_BY_SOURCE), "Number of prompt tokens by source.", "counter"
        )
        for source in vllm.PROMPT_SOURCES:
            labels = self._labels(source=source)
            by_source.add_sample(vllm.PROMPT_TOKENS_BY_SOURCE, labels, s.prompt_by_source[source])
        for source in vllm.PROMPT_SOURCES:
            by_source.add_sample(by_source.name + "_created", self._labels(source=source), s.created)
        yield by_source
        yield self._counter(
            vllm.family(vllm.GENERATION_TOKENS), "Number of generation tokens processed.", s.generation_tokens
        )
        success = Metric(vllm.family(vllm.FINISHED), "Count of successfully processed requests.", "counter")
        for reason in FINISHED_REASONS:
            success.add_sample(vllm.FINISHED, self._labels(finished_reason=reason), s.success[reason])
        for reason in FINISHED_REASONS:
            success.add_sample(success.name + "_created", self._labels(finished_reason=reason), s.created)
        yield success
        yield self._histogram(
            vllm.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", s.ttft
        )
        yield self._histogram(vllm.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", s.itl)
        yield self._histogram(vllm.E2E_LATENCY, "Histogram of e2e request latency in seconds.", s.e2e)
        yield self._histogram(
            vllm.QUEUE_TIME,
            "Histogram of time spent in WAITING phase for request.",
            s.queue_time,
        )
        # not vLLM's: what lets a check see that no prefix block from before a reset remains
        yield self._gauge(
            vllm.SIM_PREFIX_CACHE_BLOCKS, "Simulated prefix-cache blocks cached now.", float(len(cache))
        )
        yield self._counter(
            vllm.family(vllm.SIM_PREFIX_CACHE_RESETS),
            "Simulated prefix-cache resets (each drops every cached block): sleep level >= 1, "
            "POST /reset_prefix_cache.",
            cache.resets,
        )

    def _cache_config_info(self, sched: Scheduler) -> Metric:
        """As vLLM: the CacheConfig as the labels of a gauge of 1, without `model_name`; the block count
        is the live one (vLLM's is fixed at start; a `--fail-lora-kv-blocks` load takes some away)."""
        info = Metric(vllm.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig", "gauge")
        tokens = sched.total_blocks * sched.block_size
        live = {
            "block_size": str(sched.block_size),
            "effective_attention_block_size": str(sched.block_size),
            "engine": "0",
            "kv_cache_size_tokens": str(tokens),
            "num_gpu_blocks": str(sched.total_blocks),
        }
        info.add_sample(
            vllm.CACHE_CONFIG_INFO,
            dict(sorted({**CACHE_CONFIG_LABELS, **self._cache_config, **live}.items())),
            1.0,
        )
        return info


class MetricsEndpoint:
    """The `/metrics` registry: process and Python collectors plus the engine's."""

    def __init__(self, engine_collector: EngineCollector, *extra: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, engine_collector, *extra):
            self.registry.register(collector)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
