"""`corral sim --enable-prompt-tokens-details` answers as vLLM does with the flag: the usage of an answer
(and of a stream's usage event) carries `prompt_tokens_details.cached_tokens` when the prefix cache
served some of the prompt, and no details when it served none (vLLM's `if ... and num_cached_tokens`)."""

from __future__ import annotations

import urllib.request
from typing import Any

import orjson

from tests.support.procs import start_sim

PROMPT = "The harbour master logs every tide and every ship. " * 20  # ~1,000 characters


def post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url + "/v1/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10.0) as resp:
        answer: bytes = resp.read()
    return answer


def streamed_usage(answer: bytes) -> dict[str, Any]:
    events = [line[6:] for line in answer.split(b"\n") if line.startswith(b"data: {")]
    usage: dict[str, Any] = orjson.loads(events[-1])["usage"]
    return usage


def test_cached_tokens_are_reported_only_with_the_flag_and_only_when_some_were_cached() -> None:
    proc, url = start_sim(None, "--enable-prompt-tokens-details", "--max-model-len", "4096")
    plain, plain_url = start_sim(None, "--max-model-len", "4096")
    try:
        body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}
        first = orjson.loads(post(url, body))["usage"]
        assert first["prompt_tokens_details"] is None  # nothing cached yet: no details, as vLLM
        again = orjson.loads(post(url, body))["usage"]
        cached = again["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached <= again["prompt_tokens"], again
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        usage = streamed_usage(post(url, stream))
        assert usage["prompt_tokens_details"] == {"cached_tokens": cached}, usage
        fresh = streamed_usage(post(url, {**stream, "prompt": "Another text entirely. " * 40}))
        assert "prompt_tokens_details" not in fresh, fresh
        # without the flag: never any details, cached or not
        post(plain_url, body)
        assert orjson.loads(post(plain_url, body))["usage"]["prompt_tokens_details"] is None
        assert "prompt_tokens_details" not in streamed_usage(post(plain_url, stream))
    finally:
        proc.stop()
        plain.stop()
