"""The workloads of benchmarks/bench_prefix.py that issue 28 added: a sweep draw is a function of its seed;
the summary takes the worst draw; the Mooncake replay gives equal block ids equal text and unequal ones
different text; the subset cut keeps whole prefix trees; the cost-model reference goes where the prefix
is cached unless that engine's outstanding prefill costs more than the miss."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from corral.engine.sim_tokenizer import WORDS
from mooncake_trace import BlockText, CostModelReference, TraceRequest, TraceScale, cut, prefix_trees
from prefix_sweep import DrawRatios, draw, summary


@settings(deadline=None, max_examples=50)
@given(st.integers(0, 10_000), st.integers(0, 100))
def test_a_draw_is_a_function_of_its_seed(sweep_seed: int, index: int) -> None:
    a = draw(sweep_seed, index, 4, 8, 16, 0.5)
    assert a == draw(sweep_seed, index, 4, 8, 16, 0.5)
    assert 3.0 <= a.rate <= 14.0
    assert a.groups % 4 == 0 and a.system_words[0] <= a.system_words[1]


def test_summary_reports_the_worst_draw() -> None:
    draws = [{"p": DrawRatios(1.0, 0.0)}, {"p": DrawRatios(3.0, -0.2)}, {"p": DrawRatios(1.1, 0.01)}]
    (row,) = summary(draws)
    assert row["p90_ratio_median"] == 1.1 and row["p90_ratio_worst"] == 3.0
    assert row["hit_delta_worst"] == -0.2


def request(*ids: int, length: int | None = None) -> TraceRequest:
    return TraceRequest(0, length if length is not None else 512 * len(ids), 64, ids)


def test_equal_block_ids_are_equal_text() -> None:
    scale = TraceScale(block_words=8)
    text = BlockText(salt=1, words=WORDS, block_words=8)
    a, b, c = (text.prompt(request(*ids), scale).split() for ids in ((1, 2, 3), (1, 2, 4), (5, 2, 3)))
    assert a[:16] == b[:16] and a[16:] != b[16:]
    assert a[:8] != c[:8]
    assert BlockText(2, WORDS, 8).prompt(request(1), scale) != BlockText(1, WORDS, 8).prompt(
        request(1), scale
    )


def test_the_cut_keeps_whole_prefix_trees(tmp_path: Path) -> None:
    lines = [
        {"timestamp": t, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids}
        for t, ids in enumerate([[0, 1], [5, 6], [0, 1, 2], [7], [5, 8]])
    ]
    src, dst = tmp_path / "trace.jsonl", tmp_path / "subset.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    cut(src, dst, every=5)
    kept = [orjson.loads(line)["hash_ids"] for line in dst.read_bytes().splitlines()]
    assert kept == [[0, 1], [5, 6], [0, 1, 2], [5, 8]]
    assert prefix_trees([request(*ids) for ids in kept]) == [0, 1, 0, 1]


def test_the_reference_weighs_the_hit_against_the_queue() -> None:
    scale = TraceScale(block_words=100)  # 100 ms a block at 1 ms a token
    trace = [request(1, 2, 3, 10, 11, 12), request(1, 2, 3, 4), request(1, 2, 3, 4, 5)]
    ref = CostModelReference(trace, scale, engines=2, capacity_blocks=100, ms_per_token=1.0, slots=1)
    assert ref.choose(0, 0) == 0
    # engine 0 holds 1-2-3 but 600 ms of prefill are outstanding there: 600 + 100 > 400 on engine 1
    assert ref.choose(1, 0) == 1
    ref.first_token(0)
    ref.first_token(1)
    # nothing outstanding: the longer cached prefix wins (engine 1 has 1-2-3-4)
    assert ref.choose(2, 0) == 1
