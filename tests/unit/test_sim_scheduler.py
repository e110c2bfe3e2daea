"""Scheduler: running slots, FIFO waiting queue, KV block reservation, cancellation; latency under load."""

from __future__ import annotations

import asyncio

import pytest

from corral.sim.core.scheduler import EngineRequest, LatencyModel, Scheduler


def _req(name: str, prompt: int = 10, out: int = 6) -> EngineRequest:
    return EngineRequest(name, prompt, out, 0.0)


async def test_requests_beyond_max_num_seqs_wait_in_fifo_order() -> None:
    sched = Scheduler(max_num_seqs=2, total_blocks=100, block_size=16)
    a, b, c, d = (_req(n) for n in "abcd")
    await sched.admit(a)
    await sched.admit(b)
    started: list[str] = []

    async def run(r: EngineRequest) -> None:
        await sched.admit(r)
        started.append(r.request_id)

    tasks = [asyncio.create_task(run(c)), asyncio.create_task(run(d))]
    await asyncio.sleep(0)
    assert (sched.num_running, sched.num_waiting) == (2, 2)
    sched.release(a)
    await asyncio.sleep(0)
    assert started == ["c"]
    sched.release(b)
    await asyncio.gather(*tasks)
    assert started == ["c", "d"]
    assert (sched.num_running, sched.num_waiting) == (2, 0)


async def test_kv_blocks_limit_admission_and_count_as_usage() -> None:
    sched = Scheduler(max_num_seqs=10, total_blocks=4, block_size=16)
    big = _req("big", prompt=40, out=8)  # 3 blocks
    await sched.admit(big)
    assert sched.kv_usage == pytest.approx(0.75)
    small = _req("small", prompt=20, out=10)  # 2 blocks: must wait
    waiter = asyncio.create_task(sched.admit(small))
    await asyncio.sleep(0)
    assert sched.num_waiting == 1
    sched.release(big)
    await waiter
    assert sched.kv_usage == pytest.approx(0.5)


async def test_cancelled_waiter_leaves_the_queue_and_a_cancelled_admitted_one_frees_its_slot() -> None:
    sched = Scheduler(max_num_seqs=1, total_blocks=100, block_size=16)
    first = _req("first")
    await sched.admit(first)
    waiter = asyncio.create_task(sched.admit(_req("second")))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert sched.num_waiting == 0
    sched.release(first)
    assert sched.num_running == 0
    sched.release(first)  # idempotent
    assert sched.reserved_blocks == 0


def test_latency_grows_with_load() -> None:
    model = LatencyModel(ttft_base_ms=1.0, prefill_ms_per_token=0.1, itl_ms=2.0, max_num_seqs=8)
    assert model.prefill_seconds(100) == pytest.approx(0.011)
    assert model.prefill_seconds(0) < model.prefill_seconds(100)
    assert model.itl_seconds(1) == pytest.approx(0.002)
    assert model.itl_seconds(1) < model.itl_seconds(4) < model.itl_seconds(8)
