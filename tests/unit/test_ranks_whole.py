"""Whether an engine's ranks are whole (every rank on this host seen and alive: what READY and the
runbook's checks require), over a real process tree spawned here; a rank that ends once the engine's
stop began is the stop's, not a loss; the world and local sizes from the command; and the runbook
template under a rank guard: a rank lost while any step runs (POSTCHECK included) ends the step with
`RankLost` and RECOVER runs."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from corral.engine.rank_lines import ParallelSize, parallel_size
from corral.supervisor.lifecycle.ranks import EngineRanks
from corral.supervisor.runbook.template import OperationFailed, RankLost, Runbook, Step, StepFailed
from tests.support.waits import eventually
from tests.unit.test_ranks import Tree, _pid, engine_tree


def test_the_ranks_on_this_host_count_local_data_parallel_ranks_only() -> None:
    size = parallel_size(["vllm", "serve", "m", "-tp", "2", "--data-parallel-size", "4", "-dpl", "2"])
    assert (size.world, size.local) == (8, 4)
    assert parallel_size(["vllm", "serve", "m", "-tp", "2", "-dp", "2"]).local == 4
    with pytest.raises(ValueError, match="--data-parallel-size-local '0'"):
        parallel_size(["vllm", "serve", "m", "--data-parallel-size-local", "0"])


def test_an_engine_of_one_rank_has_nothing_more_to_see() -> None:
    assert EngineRanks(ParallelSize()).missing() is None


def test_ranks_never_seen_are_named_with_what_to_check() -> None:
    missing = EngineRanks(ParallelSize(tensor=2)).missing()
    assert missing is not None
    assert missing.startswith("rank 0, rank 1 not seen in the engine's log (0 of 2 seen; world size 2")
    assert "VLLM_LOGGING_LEVEL" in missing
    local = EngineRanks(ParallelSize(tensor=2, data=2, data_local=1)).missing()
    assert local is not None and local.startswith("2 of the 2 ranks on this host not seen"), local


async def test_both_ranks_seen_and_alive_are_whole_and_a_killed_one_is_named() -> None:
    with engine_tree() as tree:
        assert tree.ranks.missing() is None
        summary = tree.ranks.summary()
        assert (summary["world_size"], summary["seen"], summary["alive"], summary["whole"]) == (2, 2, 2, True)
        victim = _pid(tree, 1)
        os.kill(victim, signal.SIGKILL)
        await asyncio.wait_for(tree.ranks.watch(), 10)
        missing = tree.ranks.missing()
        assert missing is not None and missing.startswith(f"rank 1 (Worker_TP1 pid {victim}) died"), missing
        summary = tree.ranks.summary()
        assert summary["whole"] is False and summary["lost"] == missing and summary["alive"] == 1


async def test_a_rank_that_ends_once_the_stop_began_is_not_a_loss() -> None:
    with engine_tree() as tree:
        tree.ranks.stopping()
        victim = _pid(tree, 1)
        os.kill(victim, signal.SIGKILL)
        await _until_gone(tree, victim)
        tree.ranks.refresh()
        tree.ranks.note_line(
            "(EngineCore_DP0 pid=1) ERROR [multiproc_executor.py:231] Worker proc VllmWorker-1 died "
            "unexpectedly, shutting down executor."
        )
        assert tree.ranks.loss is None
        assert tree.engine.poll() is None  # the engine itself still ran: only the stop explains it


async def _until_gone(tree: Tree, pid: int) -> None:
    # SIGKILL is delivered, not awaited
    await eventually(
        lambda: not any(r["pid"] == pid and r["alive"] for r in tree.ranks.to_json()["ranks"]),
        f"pid {pid} gone",
    )


class _Guard:
    """A rank guard whose rank is lost when the test says."""

    def __init__(self) -> None:
        self.lost = asyncio.Event()

    async def broken(self) -> StepFailed:
        await self.lost.wait()
        return RankLost("rank 1 (Worker_TP1 pid 7) died", source="rank_watch", rank=1)


class _Plan:
    kind = "test"

    def __init__(self, guard: _Guard, hang_at: Step) -> None:
        self.guard = guard
        self.hang_at = hang_at
        self.calls: list[str] = []

    async def _run(self, step: Step) -> dict[str, Any]:
        self.calls.append(step.value)
        if step is self.hang_at:
            self.guard.lost.set()  # the rank dies while this step waits on the engine
            await asyncio.Event().wait()
        return {"ok": step.value}

    async def precheck(self) -> dict[str, Any]:
        return {}

    async def remove_from_routing(self) -> dict[str, Any]:
        return await self._run(Step.REMOVE_FROM_ROUTING)

    async def drain(self) -> dict[str, Any]:
        return await self._run(Step.DRAIN_POLICY)

    async def execute(self) -> dict[str, Any]:
        return await self._run(Step.EXECUTE)

    async def verify(self) -> dict[str, Any]:
        return await self._run(Step.VERIFY)

    async def recover(self, failed_step: Step, cause: str) -> dict[str, Any]:
        self.calls.append(f"recover:{failed_step}")
        return {"outcome": "FAILED, engine restarted in place"}

    async def postcheck(self) -> dict[str, Any]:
        return await self._run(Step.POSTCHECK)


@pytest.mark.parametrize("hang_at", [Step.DRAIN_POLICY, Step.EXECUTE, Step.POSTCHECK])
async def test_a_rank_lost_while_a_step_runs_ends_it_and_recover_runs(hang_at: Step) -> None:
    guard = _Guard()
    plan = _Plan(guard, hang_at)
    records: list[dict[str, Any]] = []
    book = Runbook(plan, "op-1", lambda _t, /, **f: records.append(f), lambda _: None, guard=guard)
    with pytest.raises(OperationFailed) as failed:
        await asyncio.wait_for(book.run({}), 10)
    assert failed.value.step is hang_at and failed.value.cause.startswith("rank 1 (Worker_TP1 pid 7) died")
    assert plan.calls[-1] == f"recover:{hang_at}"
    failed_step, recover = records[-2], records[-1]
    assert failed_step["step"] == hang_at.value and failed_step["status"] == "failed"
    assert failed_step["evidence"]["rank"] == 1 and failed_step["evidence"]["source"] == "rank_watch"
    assert recover["step"] == "recover" and recover["evidence"]["failed_step"] == hang_at.value
