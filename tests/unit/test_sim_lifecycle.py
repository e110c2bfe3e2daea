"""EngineLifecycle: vLLM's pause state and sleeping tags, the memory they imply, and the refusals."""

from __future__ import annotations

import pytest

from corral.sim.core.lifecycle import EngineLifecycle, LifecycleError, PauseState

W, KV = 1000, 4000


def _lc(sleep_mode: bool = True) -> EngineLifecycle:
    return EngineLifecycle(W, KV, sleep_mode)


def _sleep(lc: EngineLifecycle, level: int, mode: str = "abort") -> None:
    """What EngineControl.sleep does to the state, without the requests."""
    lc.set_pause(mode)
    if level >= 1:
        assert lc.sleep_executor(level) is None
    lc.record_sleep(level)


def test_awake_engine_holds_weights_and_kv_and_is_not_sleeping() -> None:
    lc = _lc()
    mem = lc.memory()
    assert (mem.gpu_weights, mem.gpu_kv_cache, mem.cpu_backup) == (W, KV, 0)
    assert not lc.is_sleeping and not lc.is_paused
    assert lc.sleep_state_label == "awake"


def test_level_0_pauses_scheduling_only_and_keeps_memory_resident() -> None:
    lc = _lc()
    _sleep(lc, 0, "keep")
    assert lc.is_sleeping and lc.pause is PauseState.PAUSED_ALL
    assert lc.memory().gpu_total == W + KV
    assert lc.sleep_state_label is None  # vLLM: awake, weights_offloaded and discard_all all 0
    fully, warning = lc.wake(["scheduling"])
    assert fully and warning is None
    assert not lc.is_sleeping and lc.sleep_state_label == "awake"


def test_level_1_offloads_weights_to_host_and_drops_kv() -> None:
    lc = _lc()
    _sleep(lc, 1)
    mem = lc.memory()
    assert (mem.gpu_weights, mem.gpu_kv_cache, mem.cpu_backup) == (0, 0, W)
    assert lc.sleep_state_label == "weights_offloaded"
    assert lc.wake(None) == (True, None)
    mem = lc.memory()
    assert (mem.gpu_weights, mem.gpu_kv_cache, mem.cpu_backup) == (W, KV, 0)
    assert lc.weights_valid and not lc.serves_garbage


def test_level_2_discards_everything_and_a_weights_wake_without_reload_is_garbage() -> None:
    lc = _lc()
    _sleep(lc, 2)
    assert lc.memory() == type(lc.memory())(0, 0, 0)
    assert lc.sleep_state_label == "discard_all"
    fully, _ = lc.wake(["weights"])
    assert not fully and lc.is_sleeping  # partial wake: scheduling stays paused
    assert lc.memory().gpu_weights == W and lc.memory().gpu_kv_cache == 0
    assert not lc.weights_valid
    fully, _ = lc.wake(["kv_cache"])
    assert fully and lc.serves_garbage  # awake, serving noise: vLLM does not refuse


def test_level_2_in_runbook_order_ends_awake_with_valid_weights() -> None:
    lc = _lc()
    _sleep(lc, 2)
    lc.wake(["weights"])
    lc.reload_weights()
    assert lc.weights_valid
    fully, _ = lc.wake(["kv_cache"])
    assert fully and not lc.serves_garbage


def test_reload_into_sleeping_weights_is_refused() -> None:
    lc = _lc()
    _sleep(lc, 2)
    with pytest.raises(LifecycleError, match="Call to collective_rpc method failed"):
        lc.reload_weights()


def test_unknown_or_awake_tag_makes_the_executor_wake_a_no_op_with_a_warning() -> None:
    lc = _lc()
    _sleep(lc, 1)
    fully, warning = lc.wake(["weights", "bogus"])
    assert not fully
    assert warning is not None and "Tag bogus is not in sleeping tags" in warning
    assert lc.sleeping_tags == {"weights", "kv_cache"}


def test_waking_an_engine_that_is_only_paused_warns_and_resumes() -> None:
    lc = _lc()
    _sleep(lc, 0)
    fully, warning = lc.wake(["weights"])
    assert fully and warning == "Executor is not sleeping."
    assert not lc.is_paused


def test_release_kv_needs_a_completed_pause_with_everything_resident_and_only_once() -> None:
    lc = _lc()
    with pytest.raises(LifecycleError, match="requires a completed pause first"):
        lc.check_release_kv(pause_completed=True)
    _sleep(lc, 0, "keep")
    with pytest.raises(LifecycleError, match="requires a completed pause first"):
        lc.check_release_kv(pause_completed=False)
    lc.check_release_kv(pause_completed=True)
    lc.release_kv()
    assert lc.memory().gpu_kv_cache == 0 and lc.memory().gpu_weights == W
    with pytest.raises(LifecycleError, match="requires all executor memory to be resident") as err:
        lc.check_release_kv(pause_completed=True)
    assert str(err.value).startswith("Call to release_kv_cache_memory method failed: ")
    assert lc.wake(["kv_cache"]) == (True, None)
    assert lc.memory().gpu_kv_cache == KV


def test_release_kv_after_a_level_1_sleep_is_refused() -> None:
    lc = _lc()
    _sleep(lc, 1)
    with pytest.raises(LifecycleError, match="resident"):
        lc.check_release_kv(pause_completed=True)


def test_sleeping_twice_warns_and_keeps_the_first_level() -> None:
    lc = _lc()
    _sleep(lc, 1)
    assert lc.sleep_executor(2) == "Executor is already sleeping."
    assert lc.memory().cpu_backup == W


def test_without_sleep_mode_a_sleep_pauses_but_frees_nothing() -> None:
    lc = _lc(sleep_mode=False)
    _sleep(lc, 2)
    assert lc.is_sleeping and lc.sleep_state_label == "discard_all"
    assert lc.memory().gpu_total == W + KV and lc.memory().cpu_backup == 0
    lc.wake(None)
    assert lc.weights_valid and not lc.serves_garbage  # nothing was dropped, so nothing is lost


def test_pause_rejecting_new_requests_ends_with_resume() -> None:
    lc = _lc()
    lc.set_pause("abort")
    lc.reject_new = True
    assert lc.is_sleeping  # vLLM's is_sleeping includes a paused scheduler
    lc.resume()
    assert not lc.reject_new and not lc.is_paused
