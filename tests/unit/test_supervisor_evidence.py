"""The pure rules behind stall detection and the drain's quiet period, fed LoadSamples."""

from __future__ import annotations

from corral.engine.load_sample import LoadSample, parse_load
from corral.supervisor.checks.stall import StallDetector
from corral.supervisor.lifecycle.drain import QuietPeriod

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 120.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 4.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 0.0
"""


def sample(
    at: float, running: float = 0, waiting: float = 0, finished: float = 0, tokens: float = 0
) -> LoadSample:
    return LoadSample(running, waiting, finished, tokens, at)


def test_parse_sums_label_sets() -> None:
    load = parse_load(METRICS, at=1.0)
    assert (load.running, load.waiting, load.finished, load.generation_tokens) == (2, 1, 7, 120)
    assert load.in_flight == 3 and load.admitted == 10


def test_stall_needs_running_requests_and_frozen_tokens_for_the_whole_window() -> None:
    d = StallDetector(stall_seconds=5)
    assert d.observe(sample(0, running=1, tokens=10)) is None
    assert d.observe(sample(3, running=1, tokens=10)) is None
    assert d.observe(sample(4, running=1, tokens=11)) is None  # progress resets the window
    assert d.observe(sample(8.9, running=1, tokens=11)) is None
    stall = d.observe(sample(9.1, running=2, tokens=11))
    assert stall is not None and "2 requests running" in stall.reason
    assert stall.evidence["stuck_seconds"] >= 5


def test_idle_engine_is_never_a_stall() -> None:
    d = StallDetector(stall_seconds=1)
    for t in range(10):
        assert d.observe(sample(t, running=0, tokens=5)) is None


def test_quiet_period_counts_arrivals_and_waits_for_silence() -> None:
    q = QuietPeriod(quiet_seconds=1.0)
    assert not q.observe(sample(0.0, running=2, finished=10))
    assert not q.observe(sample(0.5, running=2, finished=11))  # one finished, one arrived
    assert not q.observe(sample(1.0, running=1, finished=12))  # one finished, none arrived
    assert not q.observe(sample(1.4, running=0, finished=13))
    assert q.observe(sample(1.6, running=0, finished=13))
    assert q.arrivals == 1


def test_quiet_period_restarts_on_each_arrival() -> None:
    q = QuietPeriod(quiet_seconds=1.0)
    q.observe(sample(0.0))
    assert not q.observe(sample(0.9, waiting=1))  # arrival
    assert not q.observe(sample(1.8, running=1))  # the same request, scheduled: no arrival
    assert not q.observe(sample(1.85, running=2))  # arrival
    assert not q.observe(sample(2.5, running=0, finished=2))
    assert q.observe(sample(2.9, finished=2))
    assert q.arrivals == 2
