"""Chunked prefill in the simulator: a long prompt computed on an engine stretches the decode steps batched
beside it (as vLLM's scheduler packs them into one token budget), and a decode engine of a P/D pair, whose
prompts arrive by KV transfer, computes no prefill, so its decode steps are never stretched.

The engine runs on an event loop with a virtual clock (timers fire at once, time jumps to them), so every
duration below is the simulator's model, exact, whatever the machine's load."""

from __future__ import annotations

import asyncio
import io
import itertools
import selectors
from collections.abc import Coroutine
from typing import Any

import pytest

from corral.engine.sim_tokenizer import ToyTokenizer
from corral.sim.core.config import SimConfig
from corral.sim.core.engine import Engine, Job
from corral.sim.core.kv_transfer import KvTransfers, PullAnswer
from corral.sim.core.logs import EngineLog
from corral.sim.core.scheduler import LatencyModel, Scheduler
from corral.sim.http.protocol import parse_completion

ITL_MS = 2.0
MS_PER_TOKEN = 0.1
BUDGET = 2048
LONG = 6000  # prompt tokens of the long prefill: 600 ms of compute, about three budgets


class _Clock:
    now = 0.0


class _Selector(selectors.DefaultSelector):
    """Never blocks: when nothing is ready, the loop's clock jumps to its next timer."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if not events and timeout:
            self.clock.now += timeout
        return events


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.clock = _Clock()
        super().__init__(_Selector(self.clock))

    def time(self) -> float:
        return self.clock.now


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    loop = _VirtualLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _engine() -> Engine:
    cfg = SimConfig(
        itl_ms=ITL_MS,
        prefill_ms_per_token=MS_PER_TOKEN,
        max_num_batched_tokens=BUDGET,
        max_model_len=8192,
        max_num_seqs=8,
    )
    return Engine(cfg, ToyTokenizer(), EngineLog(io.StringIO()))


def _job(engine: Engine, rid: str, prompt: list[int], max_tokens: int, **body: Any) -> Job:
    r = parse_completion({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body})
    return engine.prepare(r, rid, asyncio.get_running_loop().time())


async def _gaps(engine: Engine, job: Job, started: asyncio.Event, after: int) -> list[float]:
    """The time between successive tokens of a streamed request; `started` is set after `after` tokens."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    async for _ in engine.stream(job):
        times.append(loop.time())
        if len(times) == after:
            started.set()
    return [b - a for a, b in itertools.pairwise(times)]


async def _drain(engine: Engine, job: Job) -> None:
    async for _ in engine.stream(job):
        pass


async def _decode_beside(engine: Engine, second: Job | None) -> list[float]:
    """A short request decodes 120 tokens; after its 10th, `second` (if any) arrives on the same engine."""
    decode = _job(engine, "decode", [7, 8, 9], 120)
    started = asyncio.Event()
    gaps = asyncio.create_task(_gaps(engine, decode, started, after=10))
    await started.wait()
    if second is not None:
        await _drain(engine, second)
    return await gaps


def _alone_itl(running: int) -> float:
    return LatencyModel(1.0, MS_PER_TOKEN, ITL_MS, 8, BUDGET).itl_seconds(running)


def test_a_long_prefill_stretches_the_decode_steps_beside_it_by_the_chunk_it_carries() -> None:
    async def main() -> tuple[list[float], list[float]]:
        alone = await _decode_beside(_engine(), None)
        engine = _engine()
        long = _job(engine, "long", list(range(100, 100 + LONG)), 1)
        return alone, await _decode_beside(engine, long)

    alone, beside = _run(main())
    assert max(alone) == pytest.approx(_alone_itl(1))
    chunk = (BUDGET - 1) * MS_PER_TOKEN / 1000  # the budget less the one decode beside it
    assert max(beside) == pytest.approx(_alone_itl(2) + chunk, rel=0.02)
    stretched = [g for g in beside if g > 2 * _alone_itl(2)]
    # the 6000-token prompt takes about three budget-sized chunks; the steps after it are plain again
    assert 2 <= len(stretched) <= 4
    assert beside[-1] == pytest.approx(_alone_itl(1))


def test_a_non_streamed_decode_beside_a_prefill_observes_the_stretched_itl() -> None:
    async def main(with_prefill: bool) -> float:
        engine = _engine()
        loop = asyncio.get_running_loop()
        if with_prefill:
            long = _job(engine, "long", list(range(100, 100 + LONG)), 1)
            task = asyncio.create_task(_drain(engine, long))
            await asyncio.sleep(0)  # the long prompt is admitted and in prefill
            assert engine.scheduler.num_prefilling == 1
        start = loop.time()
        await engine.complete(_job(engine, "decode", [7, 8, 9], 50))
        own_prefill = LatencyModel(1.0, MS_PER_TOKEN, ITL_MS, 8, BUDGET).prefill_seconds(3)
        # it waited as long as its histogram says its tokens took (the stretch is slept, not only recorded)
        assert loop.time() - start == pytest.approx(own_prefill + engine.stats.itl.sum)
        if with_prefill:
            await task
        return engine.stats.itl.sum

    alone, beside = _run(main(False)), _run(main(True))
    assert alone == pytest.approx(49 * _alone_itl(1))
    # the whole pending prefill rides on its steps (it fits in 49 budgets), less what its own prefill took
    assert beside - 49 * _alone_itl(2) == pytest.approx(LONG * MS_PER_TOKEN / 1000, rel=0.02)


def test_a_decode_engine_fed_by_kv_transfer_never_stretches_its_steps() -> None:
    producer = KvTransfers(
        {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
        "engine-p",
        Scheduler(max_num_seqs=4, total_blocks=1000, block_size=16),
        bytes_per_block=1000,
        ms_per_block=0.1,
    )
    producer.side_channel = ("127.0.0.1", 9000)

    async def fetch(host: str, port: int, request_id: str, blocks: int, timeout_s: int) -> PullAnswer:
        return await producer.serve_pull(request_id, blocks)

    async def main() -> list[float]:
        engine = _engine()
        consumer = KvTransfers(
            {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
            "engine-d",
            engine.scheduler,
            bytes_per_block=1000,
            ms_per_block=0.1,
        )
        consumer.fetch = fetch
        engine.kv = consumer
        params = producer.hold("long", prompt_len=LONG, tp_size=1)
        long = _job(engine, "long", list(range(100, 100 + LONG)), 20, kv_transfer_params=params)
        gaps = await _decode_beside(engine, long)
        assert engine.stats.prompt_by_source["external_kv_transfer"] == LONG
        return gaps

    gaps = _run(main())
    assert max(gaps) == pytest.approx(_alone_itl(2))


def test_the_pending_prefill_shrinks_as_its_time_passes_and_the_chunk_fits_the_budget() -> None:
    async def main() -> None:
        sched = Scheduler(max_num_seqs=4, total_blocks=1000, block_size=16)
        engine = _engine()
        req = _job(engine, "p", [1, 2, 3], 1).req
        sched.prefill_started(req, 1000, 1.0, now=10.0)
        assert sched.prefill_tokens_pending(10.0) == 1000
        assert sched.prefill_tokens_pending(10.75) == 250
        assert sched.prefill_tokens_pending(11.5) == 0
        sched.prefill_done(req)
        assert sched.num_prefilling == 0 and sched.prefill_tokens_pending(10.0) == 0

    _run(main())
    model = LatencyModel(1.0, MS_PER_TOKEN, ITL_MS, 8, BUDGET)
    assert model.prefill_chunk(10_000, decodes=48) == 2000
    assert model.prefill_chunk(300, decodes=48) == 300
    assert model.stretch_seconds(0, decodes=3) == 0.0
    assert model.stretched_steps(5000, decodes=48, steps=10) == (3, pytest.approx(0.5))
    assert model.stretched_steps(50_000, decodes=48, steps=10) == (10, pytest.approx(2.0))
