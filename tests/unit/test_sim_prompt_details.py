"""`prompt_tokens_details` as the real vLLM 0.32 CPU engine writes it with --enable-prompt-tokens-details
(tests/e2e/test_sim_load_semantics.py compares them): a miss says `cached_tokens: 0` instead of leaving
the details out; a chat answer says `created_cache_tokens`, a completion null there; a stream's usage
event drops the nulls."""

from __future__ import annotations

from typing import Any

import orjson

from corral.sim.http.responses import PromptCache, StreamEncoder, chat_completion, text_completion

MISS = PromptCache(cached_tokens=0, created_cache_tokens=256)
HIT = PromptCache(cached_tokens=256, created_cache_tokens=0)


def answer_details(chat: bool, cache: PromptCache | None) -> Any:
    build = chat_completion if chat else text_completion
    body = build("r", 1, "m", "fp", "text", "length", None, 278, 4, None, cache)
    return orjson.loads(body)["usage"]["prompt_tokens_details"]


def stream_details(chat: bool, cache: PromptCache | None) -> Any:
    event = StreamEncoder(chat, "r", 1, "m", "fp").usage(278, 4, cache)
    return orjson.loads(event.removeprefix(b"data: "))["usage"].get("prompt_tokens_details", "absent")


def test_a_miss_is_said_as_zero_cached_tokens() -> None:
    assert answer_details(True, MISS) == {
        "cached_tokens": 0,
        "created_cache_tokens": 256,
        "multimodal_tokens": None,
    }
    assert answer_details(False, MISS) == {
        "cached_tokens": 0,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }
    assert stream_details(True, MISS) == {"cached_tokens": 0, "created_cache_tokens": 256}
    assert stream_details(False, MISS) == {"cached_tokens": 0}


def test_a_hit_says_what_was_served_and_created_nothing() -> None:
    assert answer_details(True, HIT)["cached_tokens"] == 256
    assert stream_details(True, HIT) == {"cached_tokens": 256, "created_cache_tokens": 0}


def test_without_the_flag_there_are_no_details() -> None:
    assert answer_details(True, None) is None
    assert answer_details(False, None) is None
    assert stream_details(True, None) == "absent"
