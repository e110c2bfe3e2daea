"""Adapters loaded at run time (`POST /v1/lora/load`) outlive the supervisor: a supervisor started
again on the same state dir brings its engine to READY with them loaded; one unloaded at run time
stays gone after the next restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.test_supervisor_lora import ENV, SIM_ARGS, run_op
from tests.integration.test_supervisor_support import (
    Supervised,
    kill_leftovers,
    short_tmp_dir,
    start_supervised,
)


def stop(sup: Supervised) -> None:
    pids = sup.engine_pids()
    sup.proc.stop(grace=20)
    kill_leftovers(pids)


async def test_runtime_adapter_survives_supervisor_restart_and_its_unload_too(tmp_path: Path) -> None:
    adapter_dir = tmp_path / "adapter-rt"
    adapter_dir.mkdir()
    state_dir = short_tmp_dir() / "state"
    sup = start_supervised(sim_args=SIM_ARGS, state_dir=state_dir, env=ENV)
    try:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        op = await asyncio.to_thread(
            run_op, sup, "/v1/lora/load", {"name": "adapter-rt", "path": str(adapter_dir)}
        )
        assert op["status"] == "succeeded", op
        assert sup.state()["adapters"]["runtime"] == ["adapter-rt"]
    finally:
        stop(sup)

    sup = start_supervised(sim_args=SIM_ARGS, state_dir=state_dir, env=ENV)
    try:
        body = await asyncio.to_thread(sup.wait_state, "READY", 30)
        assert body["adapters"]["served"] == ["adapter-rt"], body["adapters"]
        assert body["adapters"]["runtime"] == ["adapter-rt"], body["adapters"]
        ready = [t for t in sup.transitions() if t["state"] == "READY" and t["sub_state"] is None]
        assert ready[-1]["evidence"]["adapters"] == ["adapter-rt"], ready[-1]
        op = await asyncio.to_thread(run_op, sup, "/v1/lora/unload", {"name": "adapter-rt"})
        assert op["status"] == "succeeded", op
    finally:
        stop(sup)

    sup = start_supervised(sim_args=SIM_ARGS, state_dir=state_dir, env=ENV)
    try:
        body = await asyncio.to_thread(sup.wait_state, "READY", 30)
        assert body["adapters"]["served"] == [], body["adapters"]
        assert body["adapters"]["desired"] == {}, body["adapters"]
        restored = [r for r in sup.oplog() if r["record"] == "runtime_adapters_restored"]
        assert [r["adapters"] for r in restored] == [{}, {"adapter-rt": str(adapter_dir)}, {}]
    finally:
        stop(sup)
