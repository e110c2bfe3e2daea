"""What an engine logs about its weight cache is untrusted input: bounded before it is kept."""

from __future__ import annotations

from corral.engine.weight_cache_log import KEPT_LINES, WeightCacheLog, mapped_in

LINE = "INFO 12-07 [ipc_loader.py:88] Mapped 291 tensors from the weight cache daemon (zero_copy mode)"


def test_vllms_line_is_read() -> None:
    found = mapped_in(LINE)
    assert found is not None and (found.tensors, found.mode) == (291, "zero_copy")


def test_a_count_too_long_to_be_one_is_not_a_mapped_line() -> None:
    # int() of 5,000 digits raises ValueError in Python 3.11: the reader must not get there
    assert mapped_in("Mapped " + "9" * 5000 + " tensors from the weight cache daemon (copy mode)") is None
    assert mapped_in("Mapped 3 tensors from the weight cache daemon (" + "x" * 1000 + " mode)") is None


def test_an_engine_that_repeats_its_lines_cannot_grow_the_record() -> None:
    log = WeightCacheLog()
    for _ in range(10 * KEPT_LINES):
        log.note(LINE)
        log.note("WARNING Weight cache unusable (no socket); falling back to disk loading " + "y" * 10_000)
    body = log.to_json()
    assert len(body["mapped"]) + len(body["fallbacks"]) == KEPT_LINES
    assert body["dropped"] == 20 * KEPT_LINES - KEPT_LINES
    assert all(len(line) <= 500 for line in body["fallbacks"])
