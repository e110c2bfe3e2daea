"""A prefix memory that learns what an engine forgot (issue 28 item 4): an answer whose usage says the
engine's cache served far less than the pick expected makes the memory forget that engine's deeper keys
of the prompt; an engine that never reported cached tokens teaches nothing by its silence."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.cache_feedback import CacheFeedback
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.pipeline import PREFIX_WEIGHTS, ScoredPolicy
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest

DOCUMENT = "The tide tables of the northern bay, corrected for the spring equinox. " * 30  # ~2,100 chars


def endpoint(i: int) -> Endpoint:
    return Endpoint(f"http://10.0.2.{i}:8000", frozenset({"m"}), EngineState.READY)


def prompt(user: int) -> RouteRequest:
    return RouteRequest("m", {}, {"prompt": DOCUMENT + f"question {user}"})


def answer(prompt_tokens: int, cached: int | None) -> bytes:
    usage: dict[str, object] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + 2}
    usage["prompt_tokens_details"] = None if cached is None else {"cached_tokens": cached}
    return orjson.dumps({"id": "cmpl-1", "choices": [{"text": "ok"}], "usage": usage})


@pytest.mark.parametrize("placement", ["cost", "headroom"])
def test_an_engine_that_served_less_than_expected_is_forgotten_deeper_than_it_served(placement: str) -> None:
    """Whatever the placement: the headroom one (the default) learns from the same answers."""
    memory = PrefixMemory()
    fleet = [endpoint(0), endpoint(1)]
    policy = ScoredPolicy("prefix", PREFIX_WEIGHTS, LoadBoard(), seed=1, holders=memory, placement=placement)
    assert policy.feedback is not None
    home = policy.pick(fleet, prompt(0))
    assert prompt(0).expected_hit is None  # nothing held anywhere: no hit expected
    second = prompt(1)
    assert policy.pick(fleet, second) is home and second.expected_hit is not None
    second.expected_hit.answered(answer(530, 512))  # served as expected: nothing learnt
    assert memory.held(prompt(2), [home]) == [1.0] and policy.feedback.corrections == 0
    third = prompt(2)
    assert policy.pick(fleet, third) is home and third.expected_hit is not None
    third.expected_hit.answered(answer(530, 150))  # under a third: the rest was evicted
    assert policy.feedback.corrections == 1
    share = memory.held(prompt(3), [home])[0]
    assert 0.0 < share <= 0.3, share


def test_silence_is_a_miss_only_from_an_engine_that_reports_cached_tokens() -> None:
    memory = PrefixMemory()
    e = endpoint(0)
    feedback = CacheFeedback(memory)
    memory.sent(prompt(0), e)
    request = prompt(1)
    feedback.expect(request, e, held=2000.0, prompt_chars=2100.0)
    assert request.expected_hit is not None
    request.expected_hit.answered(answer(530, None))  # never said what it caches: nothing learnt
    assert memory.held(prompt(2), [e]) == [1.0]
    request.expected_hit.answered(answer(530, 500))  # now it reports
    assert e.url in feedback.reporting and memory.held(prompt(2), [e]) == [1.0]
    request.expected_hit.answered(answer(530, None))  # vLLM: no details when nothing was cached
    assert memory.held(prompt(2), [e]) == [0.0] and memory.placed(e) == 0


@settings(deadline=None, max_examples=100)
@given(served=st.floats(0.0, 1.0), expected=st.floats(0.05, 1.0))
def test_the_memory_is_corrected_exactly_when_the_engine_served_under_half_of_what_was_expected(
    served: float, expected: float
) -> None:
    memory = PrefixMemory()
    e = endpoint(0)
    feedback = CacheFeedback(memory)
    memory.sent(prompt(0), e)
    request = prompt(1)
    feedback.expect(request, e, held=expected * 2100.0, prompt_chars=2100.0)
    assert request.expected_hit is not None
    request.expected_hit.answered(answer(1000, round(served * 1000)))
    missed = round(served * 1000) < 0.5 * expected * 1000
    assert feedback.corrections == (1 if missed else 0)
    if not missed:
        assert memory.held(prompt(2), [e]) == [1.0]
    else:  # nothing deeper than what was served (in whole tokens, as the answer says) is left
        assert memory.held(prompt(2), [e])[0] * 2048 <= round(served * 1000) / 1000 * 2100.0 + 1e-6


@pytest.mark.parametrize(
    "usage",
    [
        b'"usage":{"prompt_tokens":' + b"9" * 5000 + b',"prompt_tokens_details":{"cached_tokens":1}}',
        b'"usage":{"prompt_tokens":530,"prompt_tokens_details":{"cached_tokens":' + b"7" * 5000 + b"}}",
        b'"usage":{"prompt_tokens":' + b" " * 100_000 + b"530}",
    ],
    ids=["prompt-tokens-5000-digits", "cached-tokens-5000-digits", "100k-spaces"],
)
def test_an_engines_usage_out_of_bounds_teaches_nothing_and_never_raises(usage: bytes) -> None:
    """What an engine answers comes from the network: a count past 12 digits (int() of a 5,000-digit run
    raised in the proxy's answer path) or a run of blanks is no usage, so the memory keeps what it had."""
    memory = PrefixMemory()
    e = endpoint(0)
    feedback = CacheFeedback(memory)
    memory.sent(prompt(0), e)
    request = prompt(1)
    feedback.expect(request, e, held=2000.0, prompt_chars=2100.0)
    assert request.expected_hit is not None
    request.expected_hit.answered(usage)
    assert memory.held(prompt(2), [e]) == [1.0] and feedback.corrections == 0
