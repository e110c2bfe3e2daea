"""Planning a wake from the sleep level, the memory tags asleep and the tags asked for: which calls,
whether it completes the wake, and which wakes are refused before anything changes."""

from __future__ import annotations

import pytest

from corral.supervisor.runbook.template import Refused
from corral.supervisor.runbook.wake_steps import asleep_tags, check_tag_names, plan_wake

BOTH = ["weights", "kv_cache"]


def test_tags_asleep_after_each_sleep() -> None:
    assert asleep_tags({"level": 1}) == BOTH
    assert asleep_tags({"level": 2}) == BOTH
    assert asleep_tags({"level": 0, "kv_released": True}) == ["kv_cache"]
    assert asleep_tags({"level": 0}) == []
    assert asleep_tags({"level": 1, "asleep_tags": ["kv_cache"]}) == ["kv_cache"]


def test_untagged_wakes_keep_their_sequences() -> None:
    assert plan_wake(1, BOTH, None, False).sequence == ["wake_up"]
    level2 = plan_wake(2, BOTH, None, True)
    assert level2.sequence == [
        "wake_up?tags=weights",
        "collective_rpc reload_weights",
        "wake_up?tags=kv_cache",
        "wake_up",
    ]
    assert level2.completes and level2.still_asleep == []


def test_a_partial_wake_makes_no_final_untagged_call() -> None:
    steps = plan_wake(1, BOTH, ["weights"], False)
    assert steps.sequence == ["wake_up?tags=weights"]
    assert not steps.completes and steps.waking == ["weights"] and steps.still_asleep == ["kv_cache"]
    assert steps.calls == [("wake_up?tags=weights", ["weights"])]


def test_the_remaining_tags_complete_the_wake() -> None:
    steps = plan_wake(1, ["kv_cache"], ["kv_cache"], False)
    assert steps.completes and steps.sequence == ["wake_up?tags=kv_cache", "wake_up"]
    steps = plan_wake(2, ["weights"], ["weights", "scheduling"], True)
    assert steps.completes
    assert steps.sequence == ["wake_up?tags=weights", "collective_rpc reload_weights", "wake_up"]


def test_level_2_kv_cache_first_needs_no_reload_until_the_weights() -> None:
    assert not plan_wake(2, BOTH, ["kv_cache"], False).completes
    with pytest.raises(Refused, match="reload"):
        plan_wake(2, ["weights"], None, False)


@pytest.mark.parametrize(
    ("asleep", "tags", "words"),
    [
        (["kv_cache"], ["weights"], "not asleep"),
        ([], ["kv_cache"], "not asleep"),
        (BOTH, ["scheduling"], "resume serving"),
        (BOTH, ["weights", "scheduling"], "resume serving"),
    ],
)
def test_wakes_vllm_would_ignore_or_that_would_serve_early_are_refused(
    asleep: list[str], tags: list[str], words: str
) -> None:
    with pytest.raises(Refused, match=words):
        plan_wake(1, asleep, tags, False)


def test_unknown_tags_are_refused() -> None:
    with pytest.raises(Refused, match="do not exist"):
        check_tag_names(["weights", "gpu"])
    check_tag_names(["weights", "kv_cache", "scheduling"])
    check_tag_names(None)
