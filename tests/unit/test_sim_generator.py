"""Generator and faults: deterministic output, finish reasons, stop strings; the fault sequence."""

from __future__ import annotations

from corral.sim.core.faults import Fault, FaultInjector
from corral.sim.core.generator import Generator

PROMPT = list(range(300, 340))


def test_same_seed_same_request_same_text() -> None:
    a = Generator(seed=3, default_max_tokens=16).plan(PROMPT, 12, 1000, temperature=0.7, request_seed=5)
    b = Generator(seed=3, default_max_tokens=16).plan(PROMPT, 12, 1000, temperature=0.7, request_seed=5)
    assert a == b
    c = Generator(seed=4, default_max_tokens=16).plan(PROMPT, 12, 1000, temperature=0.7, request_seed=5)
    assert c.text != a.text


def test_greedy_ignores_request_seed() -> None:
    gen = Generator(seed=0, default_max_tokens=16)
    assert gen.plan(PROMPT, 8, 1000, 0.0, 1).text == gen.plan(PROMPT, 8, 1000, 0.0, 2).text


def test_max_tokens_gives_length_and_is_clamped_to_context() -> None:
    gen = Generator(seed=0, default_max_tokens=16)
    plan = gen.plan(PROMPT, 10, 1000)
    assert (plan.num_tokens, plan.finish_reason) == (10, "length")
    clamped = gen.plan(PROMPT, 10, 3)
    assert (clamped.num_tokens, clamped.finish_reason) == (3, "length")


def test_without_max_tokens_an_eos_ends_the_stream() -> None:
    gen = Generator(seed=0, default_max_tokens=16)
    plans = [gen.plan([i, i + 1], None, 1000) for i in range(20)]
    assert all(p.finish_reason == "stop" and p.stop_reason is None for p in plans)
    assert all(8 <= p.num_tokens <= 16 for p in plans)


def test_stop_string_truncates_text_and_sets_stop_reason() -> None:
    gen = Generator(seed=0, default_max_tokens=16)
    full = gen.plan(PROMPT, 200, 1000)
    assert "." in full.text
    plan = gen.plan(PROMPT, 200, 1000, stop=["."])
    assert plan.finish_reason == "stop" and plan.stop_reason == "."
    assert plan.text == full.text[: full.text.index(".")]
    assert plan.num_tokens <= full.num_tokens


def test_fault_sequence_is_repeatable_and_thresholds_hold() -> None:
    inj1, inj2 = FaultInjector(fail_rate=0.3, seed=1), FaultInjector(fail_rate=0.3, seed=1)
    seq1 = [inj1.next() for _ in range(50)]
    assert seq1 == [inj2.next() for _ in range(50)]
    assert 5 < seq1.count(Fault.FAIL) < 30
    hang = FaultInjector(hang_after=2)
    assert [hang.next() for _ in range(4)] == [Fault.NONE, Fault.NONE, Fault.HANG, Fault.HANG]
    crash = FaultInjector(crash_after=1, hang_after=0)
    assert [crash.next() for _ in range(2)] == [Fault.HANG, Fault.CRASH]


def test_fail_rate_after_spares_the_first_requests_then_fails_at_the_rate() -> None:
    late = FaultInjector(fail_rate=1.0, fail_rate_after=3)
    assert [late.next() for _ in range(5)] == [Fault.NONE] * 3 + [Fault.FAIL] * 2
    injector = FaultInjector(fail_rate=0.2, fail_rate_after=10)
    flaky = [injector.next() for _ in range(500)]
    assert Fault.FAIL not in flaky[:10] and 50 < flaky.count(Fault.FAIL) < 150
