"""The engine's sleep/pause state and the memory figures that follow it, as vLLM's engine core keeps them.

Two independent parts, as in vLLM: the scheduler's pause state (`PauseState`, set by `/sleep` at any level
and by `/pause`) and the executor's sleeping memory tags (`weights`, `kv_cache`). `is_sleeping` is true when
either is set. Memory moves only when `--enable-sleep-mode` put the allocations into the sleep allocator's
pool; without it vLLM's sleep pauses and reports success but frees nothing, and so does this model.

Pure state, no I/O: `EngineControl` drives it and applies what it says to the scheduler and requests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

SLEEP_TAGS = frozenset(("weights", "kv_cache"))
WAKE_TAGS = (*sorted(SLEEP_TAGS), "scheduling")


class PauseState(enum.Enum):
    UNPAUSED = "unpaused"
    PAUSED_NEW = "paused_new"  # new requests queue; running ones drain (modes abort, wait)
    PAUSED_ALL = "paused_all"  # nothing is scheduled; running requests are frozen (mode keep)


def worker_failure(method: str, error: str) -> str:
    """How vLLM reports an exception raised in a worker process (checked on vLLM 0.32)."""
    return (
        f"Call to {method} method failed: Worker failed with error '{error}', "
        "please check the stack trace above for the root cause"
    )


class LifecycleError(Exception):
    """An engine-core call that vLLM refuses; the message is vLLM's `Call to <method> method failed: ...`."""

    def __init__(self, method: str, reason: str, in_worker: bool = False) -> None:
        super().__init__(
            worker_failure(method, reason) if in_worker else f"Call to {method} method failed: {reason}"
        )
        self.method = method
        self.reason = reason


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes the engine holds: weights and KV cache on the GPU, the weights' backup in host memory."""

    gpu_weights: int
    gpu_kv_cache: int
    cpu_backup: int

    @property
    def gpu_total(self) -> int:
        return self.gpu_weights + self.gpu_kv_cache


class EngineLifecycle:
    """Pause state, sleeping tags, weight validity and memory of one engine."""

    def __init__(self, weights_bytes: int, kv_cache_bytes: int, sleep_mode_enabled: bool) -> None:
        self.weights_bytes = weights_bytes
        self.kv_cache_bytes = kv_cache_bytes
        self.sleep_mode_enabled = sleep_mode_enabled
        self.pause = PauseState.UNPAUSED
        self.sleeping_tags: set[str] = set()
        self.weights_offloaded = False  # level 1: the weights' backup sits in host memory
        self.weights_discarded = False  # level 2: the weights' memory was dropped; contents are lost
        self.weights_valid = True  # False from a level-2 weights wake until reload_weights
        self.reject_new = False  # set by POST /pause (vLLM 0.33: new requests get a retryable 503)
        # What `vllm:engine_sleep_state` shows: None = awake, else the last sleep level recorded. vLLM sets
        # it on /sleep (the level asked for), on /release_kv_cache_memory (0), and on a full wake (awake).
        self.recorded_level: int | None = None

    # -- queries ---------------------------------------------------------------------------------------

    @property
    def is_paused(self) -> bool:
        return self.pause is not PauseState.UNPAUSED

    @property
    def is_sleeping(self) -> bool:
        return self.is_paused or bool(self.sleeping_tags)

    @property
    def sleep_state_label(self) -> str | None:
        """The `sleep_state` label set to 1 in `vllm:engine_sleep_state`; None when all three are 0."""
        return {None: "awake", 1: "weights_offloaded", 2: "discard_all"}.get(self.recorded_level)

    @property
    def serves_garbage(self) -> bool:
        """Whether a request served now would run on memory that does not hold the model."""
        return not self.weights_valid or bool(self.sleep_mode_enabled and self.sleeping_tags)

    def memory(self) -> MemoryFigures:
        freed = self.sleeping_tags if self.sleep_mode_enabled else set()
        return MemoryFigures(
            gpu_weights=0 if "weights" in freed else self.weights_bytes,
            gpu_kv_cache=0 if "kv_cache" in freed else self.kv_cache_bytes,
            cpu_backup=self.weights_bytes if self.sleep_mode_enabled and self.weights_offloaded else 0,
        )

    def snapshot(self) -> dict[str, object]:
        mem = self.memory()
        return {
            "pause_state": self.pause.value,
            "sleeping_tags": sorted(self.sleeping_tags),
            "is_sleeping": self.is_sleeping,
            "sleep_state": self.sleep_state_label,
            "weights_valid": self.weights_valid,
            "rejecting_new_requests": self.reject_new,
            "gpu_weights_bytes": mem.gpu_weights,
            "gpu_kv_cache_bytes": mem.gpu_kv_cache,
            "cpu_backup_bytes": mem.cpu_backup,
            "sleep_mode_enabled": self.sleep_mode_enabled,
        }

    # -- scheduler -------------------------------------------------------------------------------------

    def set_pause(self, mode: str) -> None:
        self.pause = PauseState.PAUSED_ALL if mode == "keep" else PauseState.PAUSED_NEW

    def resume(self) -> None:
        self.pause = PauseState.UNPAUSED
        self.reject_new = False

    # -- executor --------------------------------------------------------------------------------------

    def sleep_executor(self, level: int) -> str | None:
        """Level 1 offloads the weights to host memory, level 2 drops them; both drop the KV cache.

        Returns vLLM's warning when the executor already sleeps (the call then changes nothing).
        """
        if "weights" in self.sleeping_tags:
            return "Executor is already sleeping."
        self.sleeping_tags |= SLEEP_TAGS
        if self.sleep_mode_enabled:
            self.weights_offloaded = level == 1
            self.weights_discarded = level == 2
        return None

    def wake_executor(self, tags: list[str] | None) -> str | None:
        """Bring the tagged allocations (all when None) back; vLLM's warning instead when it cannot.

        As in vLLM, a tag that is not asleep makes the whole call a no-op with a warning.
        """
        if not self.sleeping_tags:
            return "Executor is not sleeping."
        if tags:
            for tag in tags:
                if tag not in self.sleeping_tags:
                    return f"Tag {tag} is not in sleeping tags {self.sleeping_tags}"
        woken = set(tags) if tags else set(self.sleeping_tags)
        self.sleeping_tags -= woken
        if "weights" in woken:
            if self.weights_discarded:
                # The allocation is back, its contents are whatever the GPU had: not the model.
                self.weights_valid = False
            self.weights_offloaded = False
            self.weights_discarded = False
        return None

    def record_sleep(self, level: int) -> None:
        self.recorded_level = level

    def wake(self, tags: list[str] | None) -> tuple[bool, str | None]:
        """vLLM's `wake_up(tags)`: wake the executor tags, resume scheduling only once fully awake."""
        if tags is not None and "scheduling" in tags:
            tags = [t for t in tags if t != "scheduling"]
        warning = None
        if tags is None or tags:
            warning = self.wake_executor(tags)
        fully_awake = not self.sleeping_tags
        if fully_awake:
            self.resume()
            self.recorded_level = None
        return fully_awake, warning

    def check_release_kv(self, pause_completed: bool) -> None:
        """Raise vLLM's error unless a completed pause left every allocation resident."""
        if not (self.is_paused and pause_completed):
            raise LifecycleError(
                "release_kv_cache_memory", "release_kv_cache_memory() requires a completed pause first"
            )
        if self.sleeping_tags:
            raise LifecycleError(
                "release_kv_cache_memory",
                "release_kv_cache_memory() requires all executor memory to be resident",
            )

    def release_kv(self) -> None:
        self.sleeping_tags.add("kv_cache")
        self.recorded_level = 0

    def reload_weights(self) -> None:
        """`collective_rpc reload_weights`: load the checkpoint into the (resident) weight memory."""
        if self.sleep_mode_enabled and "weights" in self.sleeping_tags:
            raise LifecycleError(
                "collective_rpc",
                "cannot reload weights into memory that is asleep; POST /wake_up?tags=weights first "
                "(simulated: on a GPU this is an illegal memory access)",
                in_worker=True,
            )
        self.weights_valid = True
