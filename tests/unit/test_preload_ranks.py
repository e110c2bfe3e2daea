"""The preload daemon's ranks as the supervisor reads them (issue 29 item 5): vLLM's `Weight cache target
daemon rank R serving on PATH` lines (the line is the contract: vLLM's daemon.py logs it once a rank's
socket is bound), how many ranks a daemon command asks for (TP × PP × local DP, through a shell wrapper),
and doctor's branch for a lost rank."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.supervisor.lifecycle.preload_ranks import MAX_SERVING, DaemonRanks, expected_ranks
from tests.unit.test_doctor_tree import branch, engine


def test_serving_lines_as_vllm_logs_them() -> None:
    ranks = DaemonRanks(2)
    ranks.note_line(
        "INFO 12-07 00:37:48 [daemon.py:357] Weight cache target daemon rank 1 serving on "
        "/tmp/vllm_weight_cache_0/vllm_weight_cache_9f2c.sock"
    )
    assert not ranks.all_serving
    ranks.note_line("Weight cache draft daemon rank 0 serving on /tmp/x_draft.sock")  # another role
    ranks.note_line("Weight cache target daemon rank 0 serving on /tmp/x.sock")
    assert ranks.all_serving
    assert ranks.serving == {0: "/tmp/x.sock", 1: "/tmp/vllm_weight_cache_0/vllm_weight_cache_9f2c.sock"}
    assert [r["rank"] for r in ranks.to_json()] == [0, 1]


def test_expected_ranks_of_a_daemon_command() -> None:
    assert expected_ranks(("vllm", "preload", "--model", "m", "-tp", "4")) == 4
    assert expected_ranks(("vllm", "preload", "--model", "m", "-tp", "2", "-dp", "4", "-dpl", "2")) == 4
    assert expected_ranks(("sh", "-c", "CUDA_VISIBLE_DEVICES=0,1 exec vllm preload --model m -tp 2")) == 2
    assert expected_ranks(("vllm", "preload", "--model", "m", "-tp", "zero")) == 1  # PRECHECK names it


def test_doctor_names_a_lost_daemon_rank() -> None:
    reason = (
        "preload daemon rank 1 (pid 42) died; ranks still running: [0] of 2: "
        "the daemon's /health is 503 …; the daemon (pid 40) was stopped"
    )
    assert branch(engine({"state": "FAILED", "sub_state": None, "reason": reason})) == (
        "preload/daemon-rank-lost"
    )
    died = "restarting the engine: preload daemon (pid 7) exited with code -9"
    assert branch(engine({"state": "STARTING", "sub_state": "loading_model", "reason": died})) == (
        "preload/daemon-died"
    )


@settings(deadline=None, max_examples=200)
@given(st.text(max_size=200))
def test_any_daemon_line_is_read_without_an_exception(line: str) -> None:
    ranks = DaemonRanks(1)
    ranks.note_line(line)
    ranks.note_line(f"{line} Weight cache target daemon rank {len(line)} serving on /tmp/s.sock")
    assert ranks.serving.get(len(line)) == "/tmp/s.sock" and ranks.to_json()


def test_a_daemons_rank_lines_are_bounded_input() -> None:
    ranks = DaemonRanks(expected=2)
    # a rank number too long to be one (int() of 5,000 digits raises) is not a serving line
    ranks.note_line("Weight cache target daemon rank " + "7" * 5000 + " serving on /tmp/x.sock")
    assert ranks.serving == {}
    for rank in range(5 * MAX_SERVING):
        ranks.note_line(f"Weight cache target daemon rank {rank} serving on /tmp/s{rank}.sock")
    assert len(ranks.serving) == MAX_SERVING
