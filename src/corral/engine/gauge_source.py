"""The engine's gauges a traffic window is judged on (`contracts.window_figures.GaugeReading`), read
from its `/metrics`: the queue (`vllm:num_requests_waiting`, summed over data-parallel engines and
models), KV cache utilization (`vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` from a vLLM
before the rename; the highest of the engines) and, from `corral sim` only, the GPU memory it holds
(`corral_sim_gpu_memory_bytes`). A real engine's GPU memory is the device's: the supervisor reads it
through NVML (`supervisor.lifecycle.device_memory`); from `/metrics` alone it is not measured.

`engine_window_reading` reads one `/metrics` answer into both the traffic figures and these gauges,
so a window's two kinds of figures come from the same moment (OBSERVE); `sample_engines` reads a
group of engines' gauges as one engine's, the readers beside a router's figures (the rollout's
canary, `corral verify --observe-seconds`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping

import aiohttp

from corral.contracts.traffic import GAUGE_FIGURES as GAUGES
from corral.contracts.traffic import TrafficFigures
from corral.contracts.window_figures import GaugeReading, GaugeWindow
from corral.engine.load_sample import MetricsUnavailable, fetch_metrics_text
from corral.engine.metric_names import KV_USAGE, KV_USAGE_BEFORE_RENAME, SIM_GPU_MEMORY, WAITING
from corral.engine.metrics_text import samples
from corral.engine.traffic_source import traffic_figures

_NAMES = (WAITING, KV_USAGE, KV_USAGE_BEFORE_RENAME, SIM_GPU_MEMORY)
# reads `engines`' gauges once into a window (`sample_engines` with its session bound)
GaugeSampler = Callable[[Collection[str], GaugeWindow], Awaitable[None]]
GPU_MEMORY_FROM_DEVICE = (
    "a real engine shows no GPU memory in /metrics: its supervisor reads it through NVML, and this "
    "reader has none (no driver, no nvidia-ml-py, or a CPU engine)"
)


def gauge_reading(text: str) -> GaugeReading:
    """The gauges in `text`; a gauge the engine does not show reads None. Raises ValueError on text
    that is not Prometheus exposition."""
    waiting: float | None = None
    kv: dict[str, float] = {}
    memory: float | None = None
    for sample in samples(text, _NAMES, strict=True):
        if sample.name == WAITING:
            waiting = (waiting or 0.0) + sample.value
        elif sample.name == SIM_GPU_MEMORY:
            memory = (memory or 0.0) + sample.value
        else:
            kv[sample.name] = max(kv.get(sample.name, 0.0), sample.value)
    usage = kv.get(KV_USAGE, kv.get(KV_USAGE_BEFORE_RENAME))
    return GaugeReading(waiting=waiting, kv_usage=usage, gpu_memory_bytes=memory)


async def engine_window_reading(
    session: aiohttp.ClientSession, engine_url: str, within: float = 5.0
) -> tuple[TrafficFigures, GaugeReading]:
    """The engine's cumulative traffic figures and its gauges now, from one `/metrics` answer; raises
    MetricsUnavailable (no answer, or not Prometheus text)."""
    text = await fetch_metrics_text(session, engine_url, within)
    try:
        return traffic_figures(text), gauge_reading(text)
    except ValueError as exc:
        raise MetricsUnavailable(f"/metrics: {exc}") from exc


async def fetch_gauges(session: aiohttp.ClientSession, engine_url: str, within: float = 5.0) -> GaugeReading:
    """The engine's gauges now; raises MetricsUnavailable."""
    return (await engine_window_reading(session, engine_url, within))[1]


async def _one(session: aiohttp.ClientSession, url: str, within: float) -> GaugeReading | str:
    try:
        return await fetch_gauges(session, url, within)
    except MetricsUnavailable as exc:
        return str(exc)


async def read_engines(
    session: aiohttp.ClientSession, engines: Collection[str], within: float = 2.0
) -> dict[str, GaugeReading | str]:
    """Each engine's gauges now, all at once; an engine that did not answer gives why, not a reading."""
    urls = sorted(engines)
    answers = await asyncio.gather(*(_one(session, url, within) for url in urls))
    return dict(zip(urls, answers, strict=True))


def add_group(window: GaugeWindow, answers: Mapping[str, GaugeReading | str]) -> None:
    """One reading of a group of engines into `window`, as one engine's (`GaugeReading.per_engine`);
    an engine that did not answer is noted, and so is GPU memory where no engine shows it (a real
    vLLM: its supervisor reads it through NVML, not this reader)."""
    readings = [a for a in answers.values() if isinstance(a, GaugeReading)]
    for url, answer in answers.items():
        if isinstance(answer, str):
            for figure in GAUGES:
                window.note(figure, f"{url}: {answer}")
    if not readings:
        return
    reading = GaugeReading.per_engine(readings)
    window.add(reading)
    if reading.gpu_memory_bytes is None:
        window.note("gpu_memory_gib", GPU_MEMORY_FROM_DEVICE)


def with_memory(
    answers: Mapping[str, GaugeReading | str], memory: Mapping[str, float | str]
) -> dict[str, GaugeReading | str]:
    """The readings with the GPU memory another reader measured (`memory`: engine URL -> bytes, or why
    not; a rollout's from each engine's supervisor, NVML) where the engine shows none itself."""
    filled: dict[str, GaugeReading | str] = {}
    for url, answer in answers.items():
        held = memory.get(url)
        if isinstance(answer, GaugeReading) and answer.gpu_memory_bytes is None and isinstance(held, float):
            answer = GaugeReading(answer.waiting, answer.kv_usage, held)
        filled[url] = answer
    return filled


async def sample_engines(
    session: aiohttp.ClientSession,
    engines: Collection[str],
    window: GaugeWindow,
    within: float = 2.0,
    memory: Mapping[str, float | str] | None = None,
) -> None:
    """One reading of `engines`' gauges into `window` (`read_engines`, then `add_group`), with the GPU
    memory in `memory` where an engine shows none (`with_memory`; why not is noted)."""
    answers = await read_engines(session, engines, within)
    if memory is not None:
        answers = with_memory(answers, memory)
        for url in sorted(engines):
            if isinstance(why := memory.get(url, "its memory was not read"), str):
                window.note("gpu_memory_gib", f"{url}: {why}")
    add_group(window, answers)
