"""The rollout canary on a local fleet of 2 simulated engines (2 serving groups) under continuous
bounded load through the router: a new bundle that answers a fifth of its requests with errors is
stopped by the canary and taken out again, the old groups never drained and no client failing beyond
the canary's share; a healthy bundle passes the canary and the rollout succeeds, its ITL, queue and KV
judged, and its GPU memory, which its engines do not show, asked of their supervisors. Across hosts, a host
failing its canary is switched back to its bundle and the others never move."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.integration.test_rollout import SIM, Load, corral, fleet_file, read_token, routable, stop_up
from tests.integration.test_rollout_hosts import hosts
from tests.integration.test_rollout_hosts import record as host_record
from tests.integration.test_up import start_up
from tests.support.waits import eventually

CANARY = ("--canary-seconds", "20")  # a ceiling: a failing group is judged within a second or two


async def supervisor_state(url: str, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/state", headers=headers) as r:
        body: dict[str, Any] = await r.json()
        return body


def oplog_kinds(fleet: dict[str, Any], engine: dict[str, Any]) -> list[str]:
    """Every operation kind the engine's supervisor logged, from its oplog file."""
    path = Path(fleet["logs"]) / f"{engine['name']}.state" / "oplog.jsonl"
    assert path.exists(), sorted(p.name for p in Path(fleet["logs"]).iterdir())
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [str(entry.get("kind") or entry.get("operation") or "") for entry in lines]


def record_of(state: Path, port: str) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
    return body


async def test_a_bundle_failing_a_fifth_of_its_requests_is_stopped_by_the_canary(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "2", *SIM, state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        fleet = fleet_file(state, url)
        token = read_token(fleet, "supervisor_token_file")
        before = {e["name"]: await supervisor_state(e["supervisor"], token) for e in fleet["engines"]}
        bundle = tmp_path / "flaky.yaml"
        # the first 10 requests spared: the supervisor's startup smoke and VERIFY's pass, and the errors
        # meet real traffic, as a bundle's that passes its smoke tests and fails under load would
        flaky = '["--itl-ms", "5", "--fail-rate", "0.2", "--fail-rate-after", "10"]'
        bundle.write_text(f"name: flaky\nengine_args: {flaky}\n")
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        code, output = await corral(state, "rollout", "--port", port, "--to", str(bundle), *CANARY)
        # the old groups still serve everything after the rollout stopped
        after = load.outcomes["completed"]
        await eventually(lambda: load.outcomes["completed"] >= after + 20, "answers after it", within=60)
        load.stop.set()
        await load_task

        assert code == 1, output
        record = record_of(state, port)
        assert record["outcome"] == "failed"
        steps = [(s["step"], s["ok"]) for s in record["steps"]]
        assert steps == [
            ("PRECHECK", True),
            ("START", True),
            ("VERIFY", True),
            ("ROUTED", True),
            ("CANARY", False),
            ("RECOVER", True),
        ], steps
        new_group = record["steps"][1]["group"]
        assert {s["group"] for s in record["steps"][1:]} == {new_group}  # nothing touched g0 or g1
        # the reason names the step, the group and the figures
        assert record["reason"].startswith(f"CANARY {new_group}: canary failed"), record["reason"]
        assert "error ratio" in record["reason"] and "0.000 for the baseline" in record["reason"]
        canary = next(s for s in record["steps"] if s["step"] == "CANARY")
        verdict = canary["data"]["verdict"]
        window, baseline = verdict["window"], verdict["baseline"]
        print(f"canary window {window}; baseline {baseline}; load {dict(load.outcomes)}")
        assert verdict["verdict"] == "failed" and window["errors"] > 0 and baseline["errors"] == 0
        assert [v["verdict"] for v in record["canary"]] == ["failed"]
        # the new engine's first request through the rollout (VERIFY's streamed smoke) is its warmup
        assert set(record["latency"]["warmup_ttft_ms"]) == set(canary["data"]["new"])
        # the clients' failures are the bad group's 500s, no more than its share of the traffic
        failed = load.outcomes["failed_before_stream"]
        assert 0 < failed <= window["requests"], (failed, window, load.problems[:5])
        assert all("EngineCore failed" in p for p in load.problems), load.problems[:5]
        assert load.outcomes["broken"] == 0, load.problems[:5]
        # the old groups were never drained: same process, same epoch, READY and routed throughout
        after = fleet_file(state, url)
        assert after["engines"] == fleet["engines"]
        assert await routable(url) == {e["engine"] for e in fleet["engines"]}
        for engine in fleet["engines"]:
            now = await supervisor_state(engine["supervisor"], token)
            was = before[engine["name"]]
            assert now["state"] == "READY" and now["epoch"] == was["epoch"], (was["epoch"], now)
            assert now["engine"]["pid"] == was["engine"]["pid"]
            assert "drain" not in oplog_kinds(fleet, engine)
        recover = next(s for s in record["steps"] if s["step"] == "RECOVER")
        assert "taken out" in recover["detail"] and recover["data"]["reports"], recover
    finally:
        stop_up(proc)


async def test_a_healthy_bundle_passes_the_canary(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "2", *SIM, state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        bundle = tmp_path / "v2.yaml"
        # v2's engines show no memory in /metrics, as vLLM does: the canary asks their supervisors
        args = '["--itl-ms", "5", "--version-string", "0.33.1", "--no-memory-metrics"]'
        bundle.write_text(f"name: v2\nengine_args: {args}\n")
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        code, output = await corral(
            state, "rollout", "--port", port, "--to", str(bundle), "--canary-seconds", "2"
        )
        load.stop.set()
        await load_task

        assert code == 0, output
        record = record_of(state, port)
        assert record["outcome"] == "succeeded", record["reason"]
        canaries = [s for s in record["steps"] if s["step"] == "CANARY"]
        assert len(canaries) == 2 and all(s["ok"] for s in canaries), canaries
        for step in canaries:  # each new group judged on real traffic against the old ones, then drained
            verdict = step["data"]["verdict"]
            print(f"{step['group']}: {step['detail']}")
            assert verdict["verdict"] == "passed" and verdict["window"]["requests"] >= 20, verdict
            assert verdict["baseline"]["requests"] > 0
            judged = {f["figure"]: f for f in verdict["figures"]}
            assert {judged[f]["outcome"] for f in ("itl_p99_ms", "queue_waiting", "kv_usage")} == {"passed"}
            memory = judged["gpu_memory_gib"]  # no NVML figure for a simulator: named, never passed
            assert memory["outcome"] == "not_measured" and "its supervisor" in memory["reason"], memory
            mine = [s["step"] for s in record["steps"] if s["group"] == step["group"]]
            assert mine == ["START", "VERIFY", "ROUTED", "CANARY"], mine
        assert [v["verdict"] for v in record["canary"]] == ["passed", "passed"]
        new_engines = {e for step in canaries for e in step["data"]["new"]}
        assert len(new_engines) == 2 and set(record["latency"]["warmup_ttft_ms"]) == new_engines
        per_group = [s["step"] for s in record["steps"][1:-1]]
        assert per_group == ["START", "VERIFY", "ROUTED", "CANARY", "DRAIN", "RETIRE", "GONE"] * 2
        assert load.outcomes["failed_before_stream"] == 0 and load.outcomes["broken"] == 0, load.problems[:5]
    finally:
        stop_up(proc)


async def test_a_host_failing_its_canary_is_switched_back_and_the_others_never_move(tmp_path: Path) -> None:
    state = tmp_path / "state"
    flaky = tmp_path / "flaky.yaml"
    flaky.write_text('name: flaky\nengine_args: ["--fail-rate", "0.2", "--fail-rate-after", "10"]\n')
    with hosts(tmp_path, more=(flaky,)) as (sups, url, fleet):
        pids = {s.url: s.state()["engine"]["pid"] for s in sups}
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        code, output = await corral(state, "rollout", "--fleet", str(fleet), "--to", str(flaky), *CANARY)
        load.stop.set()
        await load_task

        assert code == 1, output
        rec = host_record(state, "rollout", url)
        steps = [(s["step"], s["group"], s["ok"]) for s in rec["steps"]]
        assert steps == [
            ("PRECHECK", None, True),
            ("SWITCH", "host-0", True),
            ("VERIFY", "host-0", True),
            ("ROUTED", "host-0", True),
            ("CANARY", "host-0", False),
            ("RECOVER", "host-0", True),
        ], steps
        assert rec["reason"].startswith("CANARY host-0: canary failed") and "error ratio" in rec["reason"]
        verdict = rec["steps"][4]["data"]["verdict"]
        assert verdict["baseline"]["requests"] > 0 and verdict["baseline"]["errors"] == 0, verdict
        # host-0 is back on v1 (a new engine process), host-1 never moved
        first, second = sups
        assert first.state()["bundle_name"] == "v1" and first.state()["state"] == "READY"
        assert second.state()["engine"]["pid"] == pids[second.url]
        assert "switched to v1" in rec["steps"][5]["detail"]
        assert await routable(url) == {s.engine_url for s in sups}
        failed = load.outcomes["failed_before_stream"] + load.outcomes["broken"]
        assert failed <= verdict["window"]["requests"], (failed, verdict["window"], load.problems[:5])
