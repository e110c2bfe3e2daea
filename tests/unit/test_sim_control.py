"""EngineControl against a real in-process Engine: pause modes with in-flight requests, queueing while
asleep, KV release with frozen requests, abort by id. No HTTP, no wall-clock assertions."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import pytest

from corral.engine.sim_tokenizer import ToyTokenizer
from corral.sim.core.config import SimConfig
from corral.sim.core.control import EngineControl
from corral.sim.core.engine import Engine, Job
from corral.sim.core.lifecycle import EngineLifecycle, LifecycleError
from corral.sim.core.logs import EngineLog
from corral.sim.http.protocol import parse_completion
from tests.support.waits import eventually


def _make(itl_ms: float = 5.0) -> tuple[Engine, EngineControl, io.StringIO]:
    cfg = SimConfig(itl_ms=itl_ms, max_num_seqs=4, enable_sleep_mode=True)
    out = io.StringIO()
    log = EngineLog(out)
    engine = Engine(cfg, ToyTokenizer(), log)
    lc = EngineLifecycle(cfg.weights_bytes, cfg.kv_cache_bytes, True)
    return engine, EngineControl(engine, lc, log), out


def _job(engine: Engine, rid: str, max_tokens: int = 40) -> Job:
    r = parse_completion({"prompt": "hello there", "max_tokens": max_tokens})
    return engine.prepare(r, rid, asyncio.get_running_loop().time())


async def _collect(engine: Engine, job: Job, first: asyncio.Event | None = None) -> list[str]:
    out: list[str] = []
    async for delta in engine.stream(job):
        out.append(delta)
        if first is not None:
            first.set()
    return out


async def _running(engine: Engine, n: int) -> None:
    for _ in range(5000):
        if engine.scheduler.num_running >= n:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{n} requests never ran")


async def _parked(*jobs: Job) -> None:
    """Until every one of `jobs` waits on its resume future (frozen by a `keep` sleep)."""
    await eventually(lambda: all(job.req.resumed is not None for job in jobs), "the requests to freeze")


@pytest.fixture
async def parts() -> AsyncIterator[tuple[Engine, EngineControl, io.StringIO]]:
    yield _make()


async def test_abort_mode_ends_running_and_queued_requests_with_abort(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    streamed, completed = _job(engine, "s"), _job(engine, "c")
    first = asyncio.Event()
    s = asyncio.create_task(_collect(engine, streamed, first))
    c = asyncio.create_task(engine.complete(completed))
    await first.wait()
    await _running(engine, 2)
    await control.sleep(1, "abort")
    tokens = await s
    await c
    assert streamed.aborted and streamed.finish_reason == "abort" and len(tokens) < 40
    assert completed.aborted and completed.emitted < 40
    assert engine.stats.success["abort"] == 2
    assert engine.scheduler.num_running == 0


async def test_wait_mode_lets_running_requests_finish_before_the_sleep_returns(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    job = _job(engine, "w", max_tokens=10)
    task = asyncio.create_task(engine.complete(job))
    await _running(engine, 1)
    await control.sleep(1, "wait")
    assert task.done() and not job.aborted and job.emitted == 10
    assert control.lifecycle.memory().gpu_weights == 0


async def test_requests_arriving_while_asleep_queue_and_run_after_wake(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    await control.sleep(1, "abort")
    job = _job(engine, "q", max_tokens=3)
    task = asyncio.create_task(engine.complete(job))
    await eventually(lambda: engine.scheduler.num_waiting == 1, "the request queued")
    assert not task.done()
    assert not control.wake_up(["weights"])  # partial wake: still queued
    # a wake resumes the scheduler, which starts waiting requests at once (no timer); a few loop turns
    # cover any callback it would schedule
    for _ in range(3):
        await asyncio.sleep(0)
    assert engine.scheduler.num_waiting == 1
    assert control.wake_up(["kv_cache"])
    await task
    assert job.emitted == 3 and not job.aborted


async def test_keep_mode_freezes_in_flight_and_resumes_them_after_wake(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    streamed, completed = _job(engine, "s", 30), _job(engine, "c", 30)
    first = asyncio.Event()
    s = asyncio.create_task(_collect(engine, streamed, first))
    c = asyncio.create_task(engine.complete(completed))
    await first.wait()
    await _running(engine, 2)
    await control.sleep(0, "keep")
    # both park on their resume future: from there only a wake moves them, whatever the clock does
    await _parked(streamed, completed)
    assert not s.done() and not c.done()
    control.release_kv_cache()  # frozen requests will prefill again
    assert control.wake_up(None)
    tokens = await s
    await c
    assert len(tokens) == 30 and not streamed.aborted
    assert completed.emitted == 30 and not completed.aborted
    assert engine.stats.preemptions == 2


async def test_release_kv_while_a_wait_pause_drains_is_refused() -> None:
    engine, control, _ = _make(itl_ms=20)
    job = _job(engine, "d", 20)
    task = asyncio.create_task(engine.complete(job))
    await _running(engine, 1)
    sleeping = asyncio.create_task(control.sleep(0, "wait"))
    await asyncio.sleep(0.01)
    with pytest.raises(LifecycleError, match="completed pause"):
        control.release_kv_cache()
    await sleeping
    await task
    control.release_kv_cache()
    with pytest.raises(LifecycleError, match="resident"):
        control.release_kv_cache()


async def test_abort_by_request_id_leaves_the_others_running(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    a, b = _job(engine, "a", 20), _job(engine, "b", 20)
    ta, tb = asyncio.create_task(engine.complete(a)), asyncio.create_task(engine.complete(b))
    await _running(engine, 2)
    assert control.abort({"a"}) == 1
    await ta
    await tb
    assert a.aborted and not b.aborted and b.emitted == 20


async def test_a_level_2_wake_without_reload_serves_marked_garbage(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, out = parts
    await control.sleep(2, "abort")
    control.wake_up(["weights"])
    control.wake_up(["kv_cache"])
    job = _job(engine, "g", 4)
    await engine.complete(job)
    assert job.text == " <unknown-weights>" * 4
    assert "holds no model" in out.getvalue()
    await control.reload_weights(0.0)
    job = _job(engine, "h", 4)
    await engine.complete(job)
    assert "unknown-weights" not in job.text


async def test_pause_sets_the_reject_flag_until_resume(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    await control.pause("abort", True, reject_new=True)
    assert engine.rejecting and control.lifecycle.is_paused
    control.resume()
    assert not engine.rejecting and not control.lifecycle.is_paused


async def test_reset_prefix_cache_fails_while_requests_hold_blocks(
    parts: tuple[Engine, EngineControl, io.StringIO],
) -> None:
    engine, control, _ = parts
    job = _job(engine, "r", 20)
    task = asyncio.create_task(engine.complete(job))
    await _running(engine, 1)
    assert control.reset_prefix_cache(False) is False
    assert control.reset_prefix_cache(True) is True
    await task
    assert control.reset_prefix_cache(False) is True
