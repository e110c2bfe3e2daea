import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.engine import metric_names as m
from corral.engine.metrics_text import parse_labels, samples

REAL = (Path(__file__).parents[1] / "data" / "vllm-samples" / "metrics.body").read_text()


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_strict_reads_a_real_vllm_metrics_page_as_prometheus_client_does() -> None:
    ours = [(s.name, s.labels, s.value) for s in samples(REAL, strict=True)]
    theirs = [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(REAL)
        for s in family.samples
    ]
    assert len(ours) == len(theirs) > 100
    assert all(a[:2] == b[:2] and _same(a[2], b[2]) for a, b in zip(ours, theirs, strict=True))


def test_names_filter_and_the_table_match_the_real_page() -> None:
    found = {s.name for s in samples(REAL)}
    for name in m.GAUGES + m.COUNTERS:
        if name != m.LORA_INFO:  # a real engine without --enable-lora does not expose it
            assert name in found, name
    for name in m.HISTOGRAMS:
        assert name + "_bucket" in found
    running = list(samples(REAL, names={m.RUNNING}))
    assert [s.name for s in running] == [m.RUNNING]
    assert running[0].labels["model_name"]


def test_lenient_skips_odd_lines_strict_raises() -> None:
    text = 'vllm:num_requests_running{engine="0"} 2\ngarbage line here\nvllm:num_requests_waiting nan-ish\n'
    assert [(s.name, s.value) for s in samples(text)] == [(m.RUNNING, 2.0)]
    with pytest.raises(ValueError):
        list(samples(text, strict=True))
    with pytest.raises(ValueError):
        list(samples(text, names={m.RUNNING}, strict=True))


def test_labels_with_escapes_commas_and_braces() -> None:
    assert parse_labels(r'a="x\"y",b="1,2}",c="back\\slash\n"') == {
        "a": 'x"y',
        "b": "1,2}",
        "c": "back\\slash\n",
    }
    (s,) = samples('vllm:lora_requests_info{running_lora_adapters="a,b",max_lora="2"} 1.7e9 123\n')
    assert s.labels[m.LORA_RUNNING_LABEL] == "a,b" and s.value == 1.7e9
    with pytest.raises(ValueError):
        parse_labels('a="unterminated')


def test_counter_family_names() -> None:
    assert m.family(m.PROMPT_TOKENS) == "vllm:prompt_tokens"
    assert m.family(m.KV_USAGE) == m.KV_USAGE


def test_named_search_gives_what_a_full_read_filtered_gives_in_text_order() -> None:
    names = {m.RUNNING, m.WAITING, m.KV_USAGE, m.FINISHED, m.TIME_TO_FIRST_TOKEN + "_bucket"}
    for text in (REAL, REAL.replace('engine="0"', 'engine="1"') + REAL):
        wanted = [(s.name, s.labels, s.value) for s in samples(text) if s.name in names]
        assert [(s.name, s.labels, s.value) for s in samples(text, names)] == wanted
        assert len(wanted) > 20


def test_named_search_matches_whole_names_at_line_starts_only() -> None:
    text = (
        "# HELP vllm:num_requests_waiting waiting\n"
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 9\n'
        "xvllm:num_requests_waiting 8\n"
        "vllm:num_requests_waiting 3\n"
        "vllm:num_requests_waiting not-a-number\n"
        "vllm:num_requests_waiting"
    )
    assert [s.value for s in samples(text, names={m.WAITING})] == [3.0]


def _dp(page: str, ranks: int) -> str:
    """The page as a data-parallel engine of `ranks` ranks answers it: each sample once per rank."""
    lines = []
    for line in page.split("\n"):
        if line.startswith("vllm:") and 'engine="0"' in line:
            lines += [line.replace('engine="0"', f'engine="{r}"') for r in range(ranks)]
        else:
            lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("ranks", [1, 4])
def test_the_bytes_reader_finds_what_the_full_parser_finds_on_real_pages(ranks: int) -> None:
    names = {m.RUNNING, m.WAITING, m.KV_USAGE, m.LORA_INFO, m.PROMPT_TOKENS}
    page = _dp(REAL, ranks)
    lora = 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 17.0\n'
    for text in (page, page.replace("\n", "\r\n"), lora + page, page + lora.rstrip("\n")):
        full = [(s.name, s.labels, s.value) for s in samples(text, strict=True) if s.name in names]
        found = [(s.name, s.labels, s.value) for s in samples(text.encode(), names)]
        assert found == full and len(full) >= 3 * ranks


def test_the_bytes_reader_wants_whole_names_at_line_starts() -> None:
    text = (
        b"# HELP vllm:num_requests_running running\n"
        b"vllm:num_requests_running_total 9\n"
        b'xvllm:num_requests_running{a="1"} 8\n'
        b'vllm:num_requests_running{a="2"} 2\n'
        b"vllm:num_requests_running 3"
    )
    assert [(s.value, s.labels) for s in samples(text, {m.RUNNING})] == [(2.0, {"a": "2"}), (3.0, {})]
