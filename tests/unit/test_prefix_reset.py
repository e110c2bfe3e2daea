"""VERIFY's prefix check after a wake or reload: passed only when the engine's own figure shows a reset
since before the sleep (or an empty cache), not_measured without a figure (vLLM), and a failed step when
the figure shows no reset."""

from __future__ import annotations

import pytest

from corral.engine.dev_api import EngineFigures, parse_figures
from corral.supervisor.runbook.prefix_reset import old_blocks_gone
from corral.supervisor.runbook.template import StepFailed


def figures(blocks: float | None, resets: float | None) -> EngineFigures:
    return EngineFigures("awake", None, None, None, None, blocks, resets)


def test_a_reset_since_before_the_sleep_passes_whatever_new_blocks_hold() -> None:
    verdict = old_blocks_gone(figures(40, 2), figures(3, 3))
    assert verdict["outcome"] == "passed" and verdict["resets_before"] == 2 and verdict["blocks_now"] == 3


def test_no_reset_since_before_the_sleep_fails_the_step() -> None:
    with pytest.raises(StepFailed, match="not reset since before the sleep") as failed:
        old_blocks_gone(figures(40, 2), figures(40, 2))
    assert failed.value.evidence["blocks_now"] == 40


def test_without_a_figure_it_is_not_measured_never_passed() -> None:
    assert old_blocks_gone(figures(40, 2), figures(None, None))["outcome"] == "not_measured"
    assert old_blocks_gone(None, figures(5, 1))["outcome"] == "not_measured"
    assert old_blocks_gone(None, figures(0, 1))["outcome"] == "passed"


def test_the_figures_are_read_from_the_sims_metrics_and_absent_on_vllm() -> None:
    sim = (
        'corral_sim_prefix_cache_blocks{engine="0",model_name="m"} 7.0\n'
        'corral_sim_prefix_cache_resets_total{engine="0",model_name="m"} 2.0\n'
    )
    got = parse_figures(sim)
    assert (got.prefix_cache_blocks, got.prefix_cache_resets) == (7.0, 2.0)
    vllm = 'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0\n'
    assert parse_figures(vllm).prefix_cache_resets is None
