"""`corral sim --enable-prompt-tokens-details` answers as vLLM 0.32 does with the flag: the usage of an
answer (and of a stream's usage event) carries `prompt_tokens_details.cached_tokens`, 0 when the prefix
cache served none of the prompt (older vLLM wrote no details then: `if ... and num_cached_tokens`); a chat
answer also says `created_cache_tokens`. Without the flag there are never any details."""

from __future__ import annotations

import urllib.request
from typing import Any

import orjson

from tests.support.procs import start_sim

PROMPT = "The harbour master logs every tide and every ship. " * 20  # ~1,000 characters


def post(url: str, body: dict[str, Any], path: str = "/v1/completions") -> bytes:
    request = urllib.request.Request(
        url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10.0) as resp:
        answer: bytes = resp.read()
    return answer


def streamed_usage(answer: bytes) -> dict[str, Any]:
    events = [line[6:] for line in answer.split(b"\n") if line.startswith(b"data: {")]
    usage: dict[str, Any] = orjson.loads(events[-1])["usage"]
    return usage


def test_cached_tokens_are_reported_with_the_flag_a_miss_as_zero() -> None:
    proc, url = start_sim(None, "--enable-prompt-tokens-details", "--max-model-len", "4096")
    plain, plain_url = start_sim(None, "--max-model-len", "4096")
    try:
        body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}
        first = orjson.loads(post(url, body))["usage"]
        # nothing cached yet: a miss, said as one; a completion's created_cache_tokens stays null
        assert first["prompt_tokens_details"] == {
            "cached_tokens": 0,
            "created_cache_tokens": None,
            "multimodal_tokens": None,
        }
        again = orjson.loads(post(url, body))["usage"]
        cached = again["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached <= again["prompt_tokens"], again
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        usage = streamed_usage(post(url, stream))
        assert usage["prompt_tokens_details"] == {"cached_tokens": cached}, usage
        fresh = streamed_usage(post(url, {**stream, "prompt": "Another text entirely. " * 40}))
        assert fresh["prompt_tokens_details"] == {"cached_tokens": 0}, fresh  # a stream drops the nulls
        # without the flag: never any details, cached or not
        post(plain_url, body)
        assert orjson.loads(post(plain_url, body))["usage"]["prompt_tokens_details"] is None
        assert "prompt_tokens_details" not in streamed_usage(post(plain_url, stream))
        # a chat answer also says how many of its prompt's tokens it added to the cache
        chat = {"model": "sim-model", "messages": [{"role": "user", "content": PROMPT * 2}], "max_tokens": 2}
        details = orjson.loads(post(url, chat, "/v1/chat/completions"))["usage"]["prompt_tokens_details"]
        assert details["cached_tokens"] == 0 < details["created_cache_tokens"], details
        chat_stream = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        again_details = streamed_usage(post(url, chat_stream, "/v1/chat/completions"))[
            "prompt_tokens_details"
        ]
        assert set(again_details) == {"cached_tokens", "created_cache_tokens"}  # a stream drops the nulls
        assert 0 < again_details["cached_tokens"] <= details["created_cache_tokens"], again_details
    finally:
        proc.stop()
        plain.stop()
