"""corral.router.datapath.transfer_params: what the data path strips from client bodies and relayed answers,
and its bound on held SSE bytes, however an engine cuts its stream into chunks."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.router.datapath.transfer_params import (
    SseParamsFilter,
    UnstrippableStream,
    strip_answer,
    strip_request,
)

PARAMS = {"remote_engine_id": "e1", "remote_host": "10.9.8.7", "remote_port": 5600, "remote_block_ids": [[1]]}


def test_a_clients_params_are_dropped_and_nothing_else() -> None:
    body = {"model": "m", "prompt": "kv_transfer_params", "kv_transfer_params": PARAMS}
    assert strip_request(body) and body == {"model": "m", "prompt": "kv_transfer_params"}
    assert not strip_request(body)


def test_an_answer_without_params_is_the_same_bytes() -> None:
    vllm = b'{"id":"c","choices":[],"kv_transfer_params":null}'
    assert strip_answer(vllm) is vllm
    text = b'{"choices":[{"text":"say \\"kv_transfer_params\\""}],"kv_transfer_params":null}'
    assert strip_answer(text) is text
    assert strip_answer(b"not json kv_transfer_params") == b"not json kv_transfer_params"


def test_an_answers_params_are_nulled() -> None:
    answer = orjson.dumps({"id": "c", "kv_transfer_params": PARAMS})
    assert orjson.loads(strip_answer(answer)) == {"id": "c", "kv_transfer_params": None}


EVENTS = [
    b'data: {"choices":[{"index":0,"text":"a"}]}\n\n',
    b'data: {"choices":[{"index":0,"text":"kv_transfer_params"}]}\n\n',
    b"data: " + orjson.dumps({"choices": [], "kv_transfer_params": PARAMS}) + b"\n\n",
    b": a comment naming kv_transfer_params\n\n",
    b"data: [DONE]\n\n",
]


def relay(stream: bytes, cuts: list[int], limit: int = 1 << 20) -> tuple[bytes, int]:
    """The bytes a filter sends on for `stream` cut at `cuts`, and the most it ever held."""
    sse = SseParamsFilter(limit)
    out, held = [], 0
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    for start, end in itertools.pairwise(points):
        out.append(sse.feed(stream[start:end]))
        held = max(held, len(sse._held))
    out.append(sse.finish())
    return b"".join(out), held


@settings(deadline=None, max_examples=200)
@given(st.lists(st.sampled_from(EVENTS), max_size=8), st.lists(st.integers(min_value=0), max_size=12))
def test_sse_params_are_nulled_however_the_stream_is_cut(events: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(events)
    out, _ = relay(stream, cuts)
    assert b"10.9.8.7" not in out and b"comment" not in out
    expected = stream.replace(EVENTS[2], b'data: {"choices":[],"kv_transfer_params":null}\n\n').replace(
        EVENTS[3], b"\n"
    )
    assert out == expected


@settings(deadline=None, max_examples=50)
@given(st.integers(min_value=1, max_value=4096))
def test_a_line_without_a_newline_is_held_within_the_bound(piece: int) -> None:
    line = b'data: {"pad":"' + b"x" * 40_000 + b'"}\n\n'
    out, held = relay(line, list(range(0, len(line), piece)), limit=8192)
    assert out == line and held <= 8192 + piece


def test_params_at_the_end_of_a_line_over_the_bound_end_the_stream() -> None:
    line = b'data: {"pad":"' + b"x" * 40_000 + b'","kv_transfer_params":' + orjson.dumps(PARAMS) + b"}\n\n"
    with pytest.raises(UnstrippableStream):
        relay(line, list(range(0, len(line), 1000)), limit=8192)
