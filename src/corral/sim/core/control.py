"""What the development endpoints do to a running engine: sleep, wake, pause, resume, release KV, reload
weights, reset the prefix cache, abort requests.

It follows vLLM's engine core (`v1/engine/core.py`): a sleep first pauses the scheduler with a mode
(abort: abort every request, running and queued; wait: let the running ones finish; keep: freeze them),
then at level >= 1 clears the prefix cache and puts the executor to sleep. The call returns only when the
pause has completed. Requests that arrive meanwhile queue in the scheduler. A wake resumes scheduling only
when every allocation is back; level-2 weights come back as noise until `reload_weights`.
"""

from __future__ import annotations

import asyncio
import time

from corral.sim.core.engine import Engine
from corral.sim.core.lifecycle import EngineLifecycle, PauseState
from corral.sim.core.logs import EngineLog
from corral.sim.core.scheduler import EngineRequest

_GIB = 2**30
_ABORT_SETTLE_S = 5.0  # how long an abort waits for the aborted requests to hand back their slots


def _gib(n: int) -> str:
    return f"{n / _GIB:.2f}"


class EngineControl:
    def __init__(self, engine: Engine, lifecycle: EngineLifecycle, log: EngineLog) -> None:
        self.engine = engine
        self.lifecycle = lifecycle
        self.log = log
        self._pausing = 0  # pauses still waiting for their requests to drain or abort

    def _sync(self) -> None:
        """Publish the lifecycle to the per-request flags the engine reads."""
        self.engine.garbage = self.lifecycle.serves_garbage
        self.engine.rejecting = self.lifecycle.reject_new

    # -- requests --------------------------------------------------------------------------------------

    def _running(self) -> list[EngineRequest]:
        return list(self.engine.scheduler.running)

    @staticmethod
    def _poke(req: EngineRequest, interrupt: str | None) -> None:
        req.interrupt = interrupt
        if req.resumed is not None and not req.resumed.done():
            req.resumed.set_result(None)
        elif interrupt is not None and req.task is not None:
            task, req.task = req.task, None  # cleared first: the engine tells our cancel from the client's
            task.cancel()

    def abort(self, request_ids: set[str] | None = None) -> int:
        """Abort requests (all when None), running and queued: they end with finish_reason "abort"."""
        n = len(self.engine.scheduler.abort_waiting(request_ids))
        for req in self._running():
            if request_ids is None or req.request_id in request_ids:
                if req.interrupt != "hang":
                    self._poke(req, "abort")
                    n += 1
        return n

    def _freeze(self) -> None:
        for req in self._running():
            if req.interrupt is None:
                self._poke(req, "freeze")

    def _thaw(self) -> None:
        for req in self._running():
            if req.interrupt == "freeze":
                self._poke(req, None)

    def _drop_kv_of_frozen(self) -> None:
        for req in self._running():
            if req.interrupt == "freeze":
                req.recompute = True

    async def _until_no_running(self, limit_s: float | None) -> None:
        try:
            await asyncio.wait_for(self.engine.scheduler.wait_idle(), limit_s)
        except TimeoutError:
            pass  # requests that never answer (--hang-after) do not hold the pause up

    @property
    def pause_completed(self) -> bool:
        """vLLM's "completed pause": nothing still running unfrozen (a wait pause has drained)."""
        if self._pausing:
            return False
        return self.lifecycle.pause is PauseState.PAUSED_ALL or not self.engine.scheduler.num_running

    # -- scheduler -------------------------------------------------------------------------------------

    async def pause(self, mode: str, clear_cache: bool, reject_new: bool = False) -> None:
        """Pause scheduling; `reject_new` (POST /pause) also turns new requests away with a 503."""
        lc = self.lifecycle
        state = "PAUSED_ALL" if mode == "keep" else "PAUSED_NEW"
        self.log.info("EngineCore", "scheduler.py:2756", f"setting pause state to {state}")
        if reject_new:
            lc.reject_new = True
            self._sync()
        if mode == "abort":
            self.abort()
        lc.set_pause(mode)
        self.engine.scheduler.pause()
        self._pausing += 1
        try:
            if mode == "keep":
                self._freeze()
            elif mode == "abort":
                await self._until_no_running(_ABORT_SETTLE_S)
            else:
                if self.engine.scheduler.num_running:
                    self.log.info(
                        "EngineCore",
                        "core.py:990",
                        "Waiting for in-flight requests to complete before sleeping...",
                    )
                await self._until_no_running(None)
        finally:
            self._pausing -= 1
        if clear_cache and mode != "keep":
            self.engine.cache.reset()
        self._sync()

    def resume(self) -> None:
        self.lifecycle.resume()
        self.engine.scheduler.resume()
        self._thaw()
        self._sync()

    # -- sleep -----------------------------------------------------------------------------------------

    async def sleep(self, level: int, mode: str) -> None:
        lc = self.lifecycle
        await self.pause(mode, clear_cache=level >= 1)
        if level >= 1:
            self.engine.cache.reset()
            before = lc.memory().gpu_total
            began = time.perf_counter()
            warning = lc.sleep_executor(level)
            if warning is not None:
                self.log.warning("EngineCore", "abstract.py:384", warning)
            else:
                self._drop_kv_of_frozen()
                after = lc.memory()
                self.log.info(
                    "Worker",
                    "gpu_worker.py:327",
                    f"Sleep mode freed {_gib(before - after.gpu_total)} GiB memory, "
                    f"{_gib(after.gpu_total)} GiB memory is still in use.",
                )
                self.log.info(
                    "EngineCore",
                    "abstract.py:391",
                    f"It took {time.perf_counter() - began:.6f} seconds to fall asleep.",
                )
        lc.record_sleep(level)
        self._sync()

    def wake_up(self, tags: list[str] | None) -> bool:
        lc = self.lifecycle
        self.log.info("APIServer", "api_router.py:49", f"wake up the engine with tags: {tags}")
        was_valid = lc.weights_valid
        woken_before = set(lc.sleeping_tags)
        began = time.perf_counter()
        fully_awake, warning = lc.wake(tags)
        if warning is not None:
            self.log.warning("EngineCore", "abstract.py:396", warning)
        elif woken_before - lc.sleeping_tags:
            self.log.info(
                "EngineCore",
                "abstract.py:407",
                f"It took {time.perf_counter() - began:.6f} seconds to wake up tags "
                f"{sorted(woken_before - lc.sleeping_tags)}.",
            )
        if was_valid and not lc.weights_valid:
            self.log.warning(
                "Worker",
                "gpu_worker.py:338",
                "(simulated) weights memory is resident again but holds no model (discarded at sleep "
                "level 2): call collective_rpc reload_weights before serving, or outputs are garbage",
            )
        if fully_awake:
            self.engine.scheduler.resume()
            self._thaw()
        self._sync()
        return fully_awake

    def release_kv_cache(self) -> None:
        """Raises `LifecycleError` unless paused (completed) with every allocation resident."""
        lc = self.lifecycle
        lc.check_release_kv(self.pause_completed)
        began = time.perf_counter()
        self.engine.cache.reset()
        lc.release_kv()
        self._drop_kv_of_frozen()
        self.log.info(
            "EngineCore",
            "abstract.py:430",
            f"It took {time.perf_counter() - began:.6f} seconds to discard tags {{'kv_cache'}}.",
        )
        self._sync()

    async def reload_weights(self, seconds: float) -> None:
        """Raises `LifecycleError` while the weights' memory is asleep."""
        self.lifecycle.reload_weights()
        if seconds > 0:
            await asyncio.sleep(seconds)
        # vLLM's reload_weights runs in the workers and leaves the scheduler's prefix cache alone: an
        # awake reload keeps blocks computed with the old weights until someone resets the cache.
        self.log.info("Worker", "gpu_model_runner.py:5295", f"Reloading weights took {seconds:.2f} seconds")
        self._sync()

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        running = self.engine.scheduler.num_running
        if running and not reset_running_requests:
            self.log.warning(
                "EngineCore",
                "kv_cache_manager.py:372",
                "Failed to reset prefix cache because some blocks are not freed yet "
                f"({running} running requests)",
            )
            return False
        self._drop_kv_of_frozen()
        self.engine.cache.reset()
        self.log.info("APIServer", "api_router.py:37", "Resetting prefix cache...")
        return True
