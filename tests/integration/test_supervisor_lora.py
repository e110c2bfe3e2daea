"""LoRA adapters through supervisors and a router: the desired set (`--lora`) is loaded before READY
and again after an engine restart; unloading an adapter from one engine while clients stream requests
for it fails none of them (the router stops routing it there and acknowledges first, then its
in-flight requests finish, then it is unloaded); load/unload steps are in the operation log."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.integration.test_supervisor_confirmed_drain import all_routable, start_router, wait_until
from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.procs import CorralProcess
from tests.support.streams import stream_once
from tests.support.waits import eventually

ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
SIM_ARGS = ("--enable-lora", "--max-loras", "2", "--itl-ms", "10")
STEPS = ["precheck", "remove_from_routing", "drain_policy", "execute", "verify", "postcheck"]


def run_op(sup: Supervised, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, op = http_json(sup.url + path, "POST", body)
    assert status == 202, op
    final = sup.wait_for(
        f"{path} finished",
        lambda b: any(
            o["operation_id"] == op["operation_id"] and o["status"] != "running" for o in b["operations"]
        ),
        60,
    )
    (done,) = [o for o in final["operations"] if o["operation_id"] == op["operation_id"]]
    return done


def steps(sup: Supervised, op_id: str) -> list[dict[str, Any]]:
    return [r for r in sup.oplog() if r["record"] == "runbook_step" and r["operation_id"] == op_id]


async def adapter_load(url: str, counts: dict[str, list[str]], stop: asyncio.Event) -> None:
    body = {"model": "adapter-a", "prompt": "hello adapter", "max_tokens": 10, "stream": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker() -> None:
            while not stop.is_set():
                outcome = await stream_once(session, url + "/v1/completions", body)
                counts.setdefault(outcome.kind, []).append(outcome.detail)

        await asyncio.gather(*(worker() for _ in range(8)))


async def test_adapter_unload_under_load_and_desired_set_after_restart(tmp_path: Path) -> None:
    adapter_dir = tmp_path / "adapter-a"
    adapter_dir.mkdir()
    other_dir = tmp_path / "adapter-b"
    other_dir.mkdir()
    sups = [
        start_supervised(
            sim_args=(*SIM_ARGS, "--seed", str(i)),
            sup_args=("--lora", f"adapter-a={adapter_dir}", "--propagation-timeout", "5"),
            env=ENV,
        )
        for i in range(2)
    ]
    router: CorralProcess | None = None
    try:
        for sup in sups:
            body = await asyncio.to_thread(sup.wait_state, "READY", 30)
            assert body["adapters"]["served"] == ["adapter-a"], body["adapters"]
        assert any(
            r["record"] == "adapters_reconciled" and r["loaded"] == ["adapter-a"] for r in sups[0].oplog()
        )
        router, url = start_router("router-a", sups)
        await asyncio.to_thread(router.wait_http, url + "/health")
        await wait_until(lambda: all_routable(url), 15, "both endpoints routable")
        victim, keeper = sups
        await wait_until(
            lambda: "router-a" in victim.state()["routers"]["subscribed"], 10, "router subscribed"
        )

        counts: dict[str, list[str]] = {}
        stop = asyncio.Event()
        load_task = asyncio.create_task(adapter_load(url, counts, stop))

        def completed() -> int:
            return len(counts.get("completed", []))

        await eventually(lambda: completed() >= 10, "adapter load flowing", within=60)
        op = await asyncio.to_thread(
            run_op, victim, "/v1/lora/unload", {"name": "adapter-a", "operation_id": "un-a"}
        )
        after = completed()
        await eventually(lambda: completed() >= after + 10, "answers after the unload", within=60)
        stop.set()
        await asyncio.wait_for(load_task, 60)

        assert op["status"] == "succeeded", op
        assert [(r["step"], r["status"]) for r in steps(victim, "un-a")] == [(s, "done") for s in STEPS]
        removal = next(r for r in steps(victim, "un-a") if r["step"] == "remove_from_routing")
        assert removal["evidence"]["routers_acknowledged"] == ["router-a"], removal
        assert counts.get("failed_before_stream", []) == [], counts.get("failed_before_stream")[:5]
        assert counts.get("broken", []) == [], counts.get("broken")[:5]
        assert len(counts.get("completed", [])) > 0
        assert victim.state()["adapters"]["served"] == []
        # unloading it again is refused: nothing changed
        status, body = http_json(victim.url + "/v1/lora/unload", "POST", {"name": "adapter-a"})
        assert status == 409 and "not loaded" in body["error"]["message"], body

        # a runtime load (here through the CLI) joins the desired set
        loaded = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "corral",
                "lora",
                "load",
                "--supervisor",
                keeper.url,
                "adapter-b",
                str(other_dir),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        # the printed answer is the contract: what the person who ran the command reads
        assert loaded.returncode == 0 and "succeeded" in loaded.stdout, loaded
        assert sorted(keeper.state()["adapters"]["desired"]) == ["adapter-a", "adapter-b"]

        # the keeper's engine dies: the restarted engine is READY only with both adapters loaded again
        engine_pid = keeper.state()["engine"]["pid"]
        os.kill(engine_pid, signal.SIGKILL)
        await asyncio.to_thread(
            keeper.wait_for,
            "READY after restart",
            lambda b: b.get("state") == "READY" and b["engine"]["pid"] not in (None, engine_pid),
            30,
        )
        body = keeper.state()
        assert body["adapters"]["served"] == ["adapter-a", "adapter-b"], body["adapters"]
        ready = [t for t in keeper.transitions() if t["state"] == "READY" and t["sub_state"] is None]
        assert ready[-1]["evidence"]["adapters"] == ["adapter-a", "adapter-b"]
    finally:
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
