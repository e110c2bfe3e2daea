"""The engine's worker ranks: vLLM's rank log lines read (prefixes across versions, the rank assignment,
the failure lines), and `EngineRanks` over a real process tree spawned here — a parent that starts two
children printing vLLM's prefixes — losing a rank, naming it, and ending what outlives the engine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from corral.contracts.supervisor import SupervisorState
from corral.engine.evidence import classify
from corral.engine.rank_lines import (
    ParallelSize,
    line_prefix,
    parallel_size,
    rank_assignment,
    rank_failure,
    rank_of_name,
)
from corral.fleet.checks.status_table import pid_cell
from corral.supervisor.lifecycle.ranks import EngineRanks

TP2 = ParallelSize(tensor=2)

# real lines (vLLM 0.8 to 0.32, torch's NCCL watchdog), as logged
ASSIGNED_032 = (
    "(Worker pid=23802) INFO 07-08 01:30:22 [parallel_state.py:1923] rank 0 in world size 2 is assigned "
    "as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, EP rank 0, EPLB rank N/A"
)
ASSIGNED_DP = (
    "(APIServer pid=5332) (DPEngineCoreActor pid=5439, ip=10.233.69.249) INFO 01-12 06:15:21 "
    "[parallel_state.py:1208] rank 1 in world size 2 is assigned as DP rank 1, PP rank 0, TP rank 0, "
    "EP rank 1"
)
DIED = (
    "(EngineCore_DP0 pid=265) ERROR 02-27 10:31:24 [multiproc_executor.py:231] Worker proc VllmWorker-1 "
    "died unexpectedly, shutting down executor."
)
WATCHDOG = (
    "[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
    "Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)
ENGINE_DEAD = (
    "(APIServer pid=22059) ERROR 12-02 09:44:03 [async_llm.py:480] "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


# -- the lines ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("VllmWorker-1", 1),  # the multiprocessing name (every version, before its prefix is set)
        ("VllmWorker rank=1", 1),  # 0.8
        ("VllmWorker TP1", 1),  # 0.10
        ("Worker_TP1", 1),  # 0.11 on
        ("Worker_PP1_TP0", 2),  # PP stage 1 begins after TP 2 ranks
        ("Worker_DP0_PP0_TP1_EP1", 1),
        ("Worker", None),  # the bare name says nothing in a world of two
        ("EngineCore_DP0", None),
    ],
)
def test_a_workers_name_gives_its_world_rank(name: str, rank: int | None) -> None:
    assert rank_of_name(name, ParallelSize(tensor=2, pipeline=2)) == rank


def test_the_bare_worker_name_is_rank_0_in_a_world_of_one() -> None:
    assert rank_of_name("Worker", ParallelSize()) == 0


def test_the_innermost_prefix_names_the_process_that_wrote_the_line() -> None:
    prefix = line_prefix(ASSIGNED_DP)
    assert prefix is not None and (prefix.name, prefix.pid) == ("DPEngineCoreActor", 5439)
    assert not prefix.is_worker
    worker = line_prefix("(Worker_TP1 pid=1163) INFO 10-10 11:32:51 [multiproc_executor.py:558] x")
    assert worker is not None and worker.is_worker and worker.pid == 1163
    assert line_prefix('INFO:     127.0.0.1:56094 - "GET /health HTTP/1.1" 200 OK') is None


def test_the_rank_assignment_line_is_read_in_each_versions_form() -> None:
    first = rank_assignment(ASSIGNED_032)
    assert first is not None and (first.rank, first.world_size, first.tp) == (0, 2, 0)
    dp = rank_assignment(ASSIGNED_DP)
    assert dp is not None and (dp.rank, dp.dp) == (1, 1)
    assert rank_assignment("world_size=2 rank=1 local_rank=1 backend=nccl") is None


def test_failure_lines_name_the_rank_they_are_about() -> None:
    died = rank_failure(DIED, TP2)
    assert died is not None and (died.kind, died.rank, died.worker) == ("died", 1, "VllmWorker-1")
    watchdog = rank_failure(WATCHDOG, TP2)
    assert watchdog is not None and (watchdog.kind, watchdog.rank) == ("collective_timeout", 1)
    nccl = rank_failure("(Worker_TP0 pid=7) ERROR torch.distributed.DistBackendError: NCCL error in: x", TP2)
    assert nccl is not None and (nccl.kind, nccl.rank) == ("collective_failed", 0)
    dead = rank_failure(ENGINE_DEAD, TP2)
    assert dead is not None and (dead.kind, dead.rank) == ("engine_dead", None)
    assert rank_failure("(Worker_TP1 pid=1) INFO Loading weights took 0.01 seconds", TP2) is None
    assert rank_failure("NCCL WARN Call to bind failed: Address already in use", TP2) is None


def test_rank_and_collective_failures_are_kept_as_rank_evidence() -> None:
    assert classify(DIED) == classify(WATCHDOG) == "rank"
    assert classify("(Worker_TP0 pid=7) ERROR DistBackendError: NCCL error in: ../nccl.cpp:1") == "rank"


def test_the_world_size_is_tp_times_pp_times_dp_from_the_command() -> None:
    argv = ["vllm", "serve", "m", "-tp", "2", "--pipeline-parallel-size=2", "--data-parallel-size", "2"]
    assert parallel_size(argv).world == 8
    assert parallel_size(["corral", "sim", "--model", "m"]).world == 1
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 'two' .*--tensor-parallel-size 2"):
        parallel_size(["vllm", "serve", "m", "--tensor-parallel-size", "two"])


def test_status_shows_the_ranks_alive_of_the_world_and_which_one_is_gone() -> None:
    def rank(n: int, alive: bool) -> dict[str, object]:
        return {"rank": n, "name": f"Worker_TP{n}", "pid": 40 + n, "alive": alive, "since": 0.0}

    state = {"engine": {"pid": 4}, "world_size": 2, "ranks": [rank(0, True), rank(1, True)]}
    assert pid_cell(state) == "4, ranks 2/2"
    state["ranks"] = [rank(0, True), rank(1, False)]
    assert pid_cell(state) == "4, ranks 1/2: rank 1 (Worker_TP1 pid 41) gone"
    assert pid_cell({"engine": {"pid": 4}, "world_size": 1, "ranks": []}) == "4"
    partial = {"engine": {"pid": 4}, "world_size": 4, "ranks": [rank(0, True)]}
    assert pid_cell(partial) == "4, ranks 1/4: 3 not seen"
    assert pid_cell({}) == "-"


# -- a real process tree --------------------------------------------------------------------------

# The engine stand-in: prints its pid, starts one child per rank (each in a session of its own when
# asked, as a rank that escapes the group kill would be), and sleeps without reaping them.
_ENGINE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    own_session = sys.argv[1] == "own-session"
    rank_code = (  # one write per line: two ranks' lines never interleave within a line
        "import os, sys, time; r = int(sys.argv[1]); "
        "os.write(1, (f'(Worker pid={os.getpid()}) INFO rank {r} in world size 2 is assigned as "
        "DP rank 0, PP rank 0, TP rank {r}' + chr(10)).encode()); "
        "os.write(1, (f'(Worker_TP{r} pid={os.getpid()}) INFO loading' + chr(10)).encode()); "
        "time.sleep(120)"
    )
    for r in (0, 1):
        subprocess.Popen([sys.executable, "-c", rank_code, str(r)], start_new_session=own_session)
    time.sleep(120)
    """
)


@dataclass
class Tree:
    engine: subprocess.Popen[str]
    ranks: EngineRanks
    lines: list[str]


def _feed(tree: Tree, lines: int) -> None:
    """Read the stand-in's first `lines` lines into `EngineRanks`."""
    assert tree.engine.stdout is not None
    while len(tree.lines) < lines:
        line = tree.engine.stdout.readline()
        assert line, "the stand-in engine exited early"
        tree.lines.append(line.rstrip("\n"))
        tree.ranks.note_line(line.rstrip("\n"))


@contextlib.contextmanager
def engine_tree(own_session: bool = False) -> Iterator[Tree]:
    engine = subprocess.Popen(
        [sys.executable, "-c", _ENGINE, "own-session" if own_session else "group"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ranks = EngineRanks(TP2, poll_seconds=0.05)
    ranks.attach(engine.pid, psutil.Process(engine.pid).create_time())
    tree = Tree(engine, ranks, [])
    try:
        _feed(tree, 4)  # two lines from each rank
        yield tree
    finally:
        pids = [r["pid"] for r in ranks.ranks_json() if r["alive"] is not None]  # its own only
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        engine.wait(10)


def _pid(tree: Tree, rank: int) -> int:
    return int(next(r["pid"] for r in tree.ranks.ranks_json() if r["rank"] == rank))


async def test_both_ranks_are_seen_alive_with_their_names_and_pids() -> None:
    with engine_tree() as tree:
        body = tree.ranks.to_json()
        assert body["world_size"] == 2
        assert [(r["rank"], r["name"], r["alive"]) for r in body["ranks"]] == [
            (0, "Worker_TP0", True),
            (1, "Worker_TP1", True),
        ]
        wire = SupervisorState.model_validate({"state": "READY", "epoch": 1, **body})  # the contract
        assert wire.world_size == 2 and [r.name for r in wire.ranks] == ["Worker_TP0", "Worker_TP1"]
        children = psutil.Process(tree.engine.pid).children()
        assert {r["pid"] for r in body["ranks"]} == {c.pid for c in children}
        assert tree.ranks.loss is None


async def test_a_killed_rank_is_a_loss_that_names_it_while_the_engine_runs() -> None:
    with engine_tree() as tree:
        victim = _pid(tree, 1)
        os.kill(victim, signal.SIGKILL)  # the parent never reaps it: a zombie is a dead rank too
        loss = await asyncio.wait_for(tree.ranks.watch(), 10)
        assert loss.rank == 1
        assert loss.reason.startswith(f"rank 1 (Worker_TP1 pid {victim}) died")
        assert loss.evidence["source"] == "rank_watch" and loss.evidence["kind"] == "died"
        alive = {r["rank"]: r["alive"] for r in tree.ranks.to_json()["ranks"]}
        assert alive == {0: True, 1: False}
        assert tree.engine.poll() is None  # the engine itself still runs


async def test_a_rank_failure_line_is_a_loss_before_any_process_dies() -> None:
    with engine_tree() as tree:
        tree.ranks.note_line(DIED)
        loss = await asyncio.wait_for(tree.ranks.watch(), 5)
        victim = _pid(tree, 1)
        assert loss.rank == 1
        assert loss.reason.startswith(f"rank 1 (Worker_TP1 pid {victim}) died: Worker proc")
        assert loss.evidence["line"] == DIED
        assert all(r["alive"] for r in tree.ranks.to_json()["ranks"])


async def test_the_whole_engine_going_is_its_exit_not_a_ranks_loss() -> None:
    with engine_tree() as tree:
        pids = [_pid(tree, 0), _pid(tree, 1)]
        os.killpg(tree.engine.pid, signal.SIGKILL)
        tree.engine.wait(10)
        for _ in range(200):  # SIGKILL is delivered, not awaited: until both ranks are gone
            if not any(_running(pid) for pid in pids):
                break
            await asyncio.sleep(0.05)
        tree.ranks.refresh()
        assert tree.ranks.loss is None
        assert tree.ranks.final_loss() is None
        assert not any(r["alive"] for r in tree.ranks.to_json()["ranks"])


async def test_reap_ends_ranks_that_outlive_their_engine_in_a_session_of_their_own() -> None:
    with engine_tree(own_session=True) as tree:
        ranks = [_pid(tree, 0), _pid(tree, 1)]
        tree.ranks.refresh()  # what EngineProcess.stop does before it stops the group
        os.killpg(tree.engine.pid, signal.SIGKILL)  # the group kill: the ranks are not in it
        tree.engine.wait(10)
        assert all(psutil.pid_exists(pid) for pid in ranks)
        killed = await tree.ranks.reap(within=10)
        assert sorted(ranks) == [pid for pid in killed if pid in ranks]
        assert not any(_running(pid) for pid in ranks)
        assert await tree.ranks.reap() == []  # nothing left the second time


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_pid_outside_the_engines_tree_is_shown_but_never_watched_or_killed() -> None:
    with engine_tree() as tree:
        tree.ranks.note_line(f"(Worker_PP1_TP0 pid={os.getpid()}) INFO a line naming this test's process")
        foreign = next(r for r in tree.ranks.ranks_json() if r["rank"] == 2)
        assert foreign["pid"] == os.getpid() and foreign["alive"] is None
        tree.ranks.refresh()
        assert tree.ranks.loss is None
        killed = await tree.ranks.reap(within=10)  # the stand-in's ranks go; this process does not
        assert os.getpid() not in killed and sorted(killed) == sorted([_pid(tree, 0), _pid(tree, 1)])


async def test_an_engine_dead_line_names_the_rank_already_found_dead() -> None:
    with engine_tree() as tree:
        victim = _pid(tree, 0)
        os.kill(victim, signal.SIGKILL)
        for _ in range(200):  # until the kill has landed (a zombie counts)
            if not _running(victim):
                break
            await asyncio.sleep(0.05)
        ranks = EngineRanks(TP2)  # a second view of the same tree that has not looked since
        ranks.attach(tree.engine.pid, psutil.Process(tree.engine.pid).create_time())
        for line in tree.lines:
            ranks.note_line(line)
        assert ranks.loss is not None and ranks.loss.rank == 0  # found dead when its line was read
        fresh = EngineRanks(TP2)
        fresh.attach(tree.engine.pid, psutil.Process(tree.engine.pid).create_time())
        fresh.note_line(ENGINE_DEAD)
        assert fresh.loss is not None and fresh.loss.rank is None
        assert fresh.loss.reason.startswith("engine core dead: vllm.v1.engine.exceptions.EngineDeadError")
        # vLLM may log EngineDeadError before the line that names its dead worker: the dead rank is named
        tree.ranks.note_line(ENGINE_DEAD)
        loss = tree.ranks.loss
        assert loss is not None and loss.rank == 0 and loss.evidence["kind"] == "died"
        assert loss.reason.startswith(f"rank 0 (Worker_TP0 pid {victim}) died: vllm.v1.engine")
