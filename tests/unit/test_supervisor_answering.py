"""The not-answering rule (supervisor/checks/answering.py): a READY engine is withdrawn only after its
`/health` has not answered 200 for the whole limit, a slow answer inside the limit is an answer, and
every probe may wait for the time left before the limit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.supervisor.checks.answering import AnswerRule, HealthProbe

LIMIT = 5.0


def timeout(at: float, seconds: float) -> HealthProbe:
    return HealthProbe(at, seconds, None, f"timed out after {seconds:.1f}s")


def test_one_probe_that_waits_out_the_limit_withdraws_with_its_evidence() -> None:
    rule = AnswerRule(LIMIT, answered_at=100.0)
    assert rule.timeout_for(100.0) == LIMIT  # the first probe may wait the whole limit
    verdict = rule.observe(timeout(100.0, LIMIT))
    assert verdict is not None
    assert "not answering" in verdict.reason and "--unanswered-seconds 5" in verdict.reason
    assert verdict.evidence["probes_timed_out"] == 1
    assert verdict.evidence["unanswered_seconds"] == LIMIT
    assert verdict.evidence["last_probes"] == [{"seconds": LIMIT, "answer": "timed out after 5.0s"}]


def test_a_slow_answer_inside_the_limit_is_an_answer() -> None:
    rule = AnswerRule(LIMIT, answered_at=0.0)
    assert rule.observe(HealthProbe(1.0, 3.9, 200)) is None
    assert rule.answered_at == 4.9 and rule.last_answer == "HTTP 200"
    assert rule.timeout_for(5.0) == LIMIT - 0.1


def test_refusals_and_errors_count_as_silence_and_the_probe_never_waits_less_than_a_period() -> None:
    rule = AnswerRule(LIMIT, answered_at=0.0)
    at = 0.0
    verdict = None
    while verdict is None:
        assert rule.timeout_for(at) >= rule.period
        verdict = rule.observe(HealthProbe(at, 0.01, None if at < 2 else 503, "refused" if at < 2 else None))
        at += rule.period
    assert verdict.evidence["probes_unanswered"] == 6 and verdict.evidence["probes_timed_out"] == 0
    assert "HTTP 503" in verdict.reason


@settings(deadline=None, max_examples=300)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 6.0), st.sampled_from([200, 503, None])),
        min_size=1,
        max_size=40,
    )
)
def test_withdrawn_exactly_when_no_200_came_for_the_limit(
    probes: list[tuple[float, float, int | None]],
) -> None:
    rule = AnswerRule(LIMIT, answered_at=0.0)
    now, last_200 = 0.0, 0.0
    for gap, seconds, status in probes:
        at = now + gap
        seconds = min(seconds, rule.timeout_for(at))  # a probe never waits past its own timeout
        probe = HealthProbe(at, seconds, status, None if status is not None else "timed out")
        verdict = rule.observe(probe)
        now = at + seconds
        if status == 200:
            last_200 = now
            assert verdict is None
        else:
            assert (verdict is not None) == (now - last_200 >= LIMIT)
        if verdict is not None:
            return
