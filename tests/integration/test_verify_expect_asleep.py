"""`corral verify --expect-asleep ENGINE[=LEVEL]` against real supervisors and a router: after a
planned sleep the checklist passes with the engine asleep at the expected level (and fails without
the option); it fails naming the sleep check when the engine is asleep at another level, partially
woken, or awake again, and when the option names no engine of the fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from tests.integration.test_supervisor_confirmed_drain import all_routable, start_router, wait_until
from tests.integration.test_supervisor_partial_wake import run_op
from tests.integration.test_supervisor_sleep_ops import DEV, SIM_ARGS
from tests.integration.test_supervisor_support import Supervised, kill_leftovers, start_supervised
from tests.integration.test_verify import failed_checks
from tests.support.procs import CorralProcess

SUP_ARGS = ("--propagation-timeout", "5", "--quiet-period", "0.3")


def verify(record: Path, fleet: list[str], *args: str) -> tuple[int, str, dict[str, Any]]:
    proc = CorralProcess(["verify", *fleet, "--record", str(record), *args], env={"COLUMNS": "250"})
    code = proc.wait_exit(60)
    body = orjson.loads(record.read_bytes()) if record.exists() else {}
    return code, proc.output(), body


def sleep_detail(body: dict[str, Any]) -> str:
    (check,) = [c for c in body["checks"] if c["check"] == "sleep"]
    return str(check["detail"])


async def test_expected_asleep_passes_only_when_asleep_at_that_level(tmp_path: Path) -> None:
    sups: list[Supervised] = [
        start_supervised(sim_args=(*SIM_ARGS, "--seed", str(i)), sup_args=SUP_ARGS, env=DEV) for i in range(2)
    ]
    router: CorralProcess | None = None
    try:
        for sup in sups:
            await asyncio.to_thread(sup.wait_state, "READY", 30)
        router, url = start_router("router-a", sups)
        await asyncio.to_thread(router.wait_http, url + "/health")
        await wait_until(lambda: all_routable(url), 15, "both endpoints routable")
        fleet = ["--router", url, "--supervisor", sups[0].url, "--supervisor", sups[1].url]
        record = tmp_path / "verify.json"
        sleeper = sups[1]
        op = await asyncio.to_thread(run_op, sleeper, "/v1/sleep", {"level": 1, "mode": "wait"})
        assert op["status"] == "succeeded", op

        code, out, body = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", "engine-1=1")
        assert code == 0, out
        assert "asleep as expected: engine-1 level 1" in sleep_detail(body), body
        assert body["expected"]["asleep"] == {"engine-1": 1}
        # by its engine URL, without a level
        code, out, _ = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", sleeper.engine_url)
        assert code == 0, out

        code, out, body = await asyncio.to_thread(verify, record, fleet)
        assert code == 1 and "sleep" in failed_checks(out), out
        code, out, body = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", "engine-1=2")
        assert code == 1 and failed_checks(out) == ["sleep"], out
        assert "expected level 2" in sleep_detail(body) and "discard_all" in sleep_detail(body), body
        code, out, body = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", "engine-9")
        assert code == 1 and failed_checks(out) == ["processes", "sleep"], out
        assert "no engine 'engine-9'" in sleep_detail(body), body
        assert "sleeping (expected awake): engine-1" in sleep_detail(body), body
        code, out, _ = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", "engine-1=7")
        assert code == 2 and "level must be 0, 1 or 2" in out, out

        op = await asyncio.to_thread(run_op, sleeper, "/v1/wake", {"tags": ["weights"]})
        assert op["status"] == "succeeded", op
        code, out, body = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", "engine-1")
        assert code == 1 and failed_checks(out) == ["sleep"], out
        assert "partially awake" in sleep_detail(body), body

        op = await asyncio.to_thread(run_op, sleeper, "/v1/wake", {})
        assert op["status"] == "succeeded", op
        await wait_until(lambda: all_routable(url), 15, "both endpoints routable again")
        code, out, body = await asyncio.to_thread(verify, record, fleet, "--expect-asleep", "engine-1")
        assert code == 1 and failed_checks(out) == ["sleep"], out
        assert "READY, not SLEEPING" in sleep_detail(body) and "/is_sleeping false" in sleep_detail(body)
        code, out, _ = await asyncio.to_thread(verify, record, fleet)
        assert code == 0, out
    finally:
        if router is not None:
            router.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)
