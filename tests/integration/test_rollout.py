"""`corral rollout` and `corral rollback` on a local fleet of 4 simulated engines in 2 serving groups,
under continuous bounded load through the router: no request lost, no stream cut, no serving group
ever mixing fingerprints, every step in the change record with its timing; and a rollout whose new
bundle fails its smoke test stops with the old fleet serving every request."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

from tests.integration.test_rollout_record import check_complete_record
from tests.integration.test_up import descendants, local_fleet_file_under, start_up
from tests.support.procs import CorralProcess
from tests.support.streams import stream_once
from tests.support.waits import eventually

LOAD_WORKERS = 8
LOAD_MAX_REQUESTS = 20_000  # far beyond what a test sends: reaching it means the load ran away
LOAD_MAX_SECONDS = 240.0
SIM = ("--sim-arg=--itl-ms=5",)  # streams of 16 tokens last ~80 ms: many are in flight at every drain


@dataclass
class Load:
    """Streamed and non-streamed chat requests through the router until stopped (bounded)."""

    url: str
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _one(self, session: aiohttp.ClientSession, n: int) -> None:
        body: dict[str, Any] = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": f"rollout load {n}"}],
            "max_tokens": 16,
        }
        if n % 2:
            outcome = await stream_once(session, self.url + "/v1/chat/completions", {**body, "stream": True})
            kind, detail = outcome.kind, outcome.detail
        else:
            try:
                async with session.post(self.url + "/v1/chat/completions", json=body) as resp:
                    reply = await resp.read()
                    ok = resp.status == 200 and orjson.loads(reply)["choices"][0]["finish_reason"]
                    kind, detail = (
                        ("completed", "")
                        if ok
                        else ("failed_before_stream", f"{resp.status} {reply[:200]!r}")
                    )
            except aiohttp.ClientError as exc:
                kind, detail = "failed_before_stream", repr(exc)
        self.outcomes[kind] += 1
        if kind != "completed":
            self.problems.append(f"{kind}: {detail}")

    async def run(self) -> None:
        deadline = time.monotonic() + LOAD_MAX_SECONDS
        counter = iter(range(LOAD_MAX_REQUESTS))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

            async def worker() -> None:
                for n in counter:
                    if self.stop.is_set() or time.monotonic() > deadline:
                        return
                    await self._one(session, n)

            await asyncio.gather(*(worker() for _ in range(LOAD_WORKERS)))

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


@dataclass
class GroupWatch:
    """Samples every serving group's members (the fleet's control API, then each supervisor's
    /v1/state) and keeps any moment where one group showed two fingerprints."""

    control: str
    token: str
    supervisor_token: str  # the fleet's own, which every supervisor of a `corral up` fleet wants
    mixed: list[str] = field(default_factory=list)
    seen: dict[str, set[str]] = field(default_factory=dict)  # group -> fingerprints over time
    samples: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while not stop.is_set():
                async with session.get(self.control + "/v1/groups", headers=headers) as resp:
                    groups = (await resp.json())["groups"]
                for group in groups:
                    prints = set()
                    for member in group["members"]:
                        try:
                            async with session.get(
                                member["supervisor"] + "/v1/state",
                                headers={"Authorization": f"Bearer {self.supervisor_token}"},
                            ) as resp:
                                state = await resp.json()
                        except aiohttp.ClientError:
                            continue  # a member being stopped: it serves nothing
                        if state["state"] == "READY":
                            prints.add(state["bundle"]["fingerprint"])
                    if len(prints) > 1:
                        self.mixed.append(f"{group['name']}: {sorted(prints)}")
                    self.seen.setdefault(group["name"], set()).update(prints)
                self.samples += 1
                await asyncio.sleep(0.05)


def fleet_file(state_home: Path, url: str) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    body: dict[str, Any] = orjson.loads(local_fleet_file_under(state_home, port).read_bytes())
    return body


def read_token(fleet: dict[str, Any], key: str = "token_file") -> str:
    return Path(fleet[key]).read_text().strip()


async def corral(state_home: Path, *args: str) -> tuple[int, str]:
    proc = CorralProcess(list(args), env={"XDG_STATE_HOME": str(state_home)})
    code = await asyncio.to_thread(proc.wait_exit, 300)
    return code, proc.output()


async def routable(url: str) -> set[str]:
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/fleet") as resp:
        body = await resp.json()
    return {e["url"] for e in body["endpoints"] if e["routable"]}


def stop_up(proc: CorralProcess) -> None:
    children = descendants(proc.pid)
    proc.signal(signal.SIGINT)
    assert proc.wait_exit(60) == 0, proc.output()[-3000:]
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


async def test_rollout_and_rollback_under_load_lose_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "4", "--group-size", "2", *SIM, state_home=state)
    try:
        fleet = fleet_file(state, url)
        token = read_token(fleet)
        old_engines = {e["engine"] for e in fleet["engines"]}
        assert await routable(url) == old_engines
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--itl-ms", "5", "--version-string", "0.33.1"]\n')

        supervisor_token = read_token(fleet, "supervisor_token_file")
        load, watch = Load(url), GroupWatch(fleet["control"], token, supervisor_token)
        stop_watch = asyncio.Event()
        load_task = asyncio.create_task(load.run())
        watch_task = asyncio.create_task(watch.run(stop_watch))
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        before_forward = load.total
        forward = await corral(state, "rollout", "--port", url.rsplit(":", 1)[1], "--to", str(bundle))
        after_forward = load.total
        back = await corral(state, "rollback", "--port", url.rsplit(":", 1)[1], "--max-surge", "2")
        after_back = load.total
        after = load.outcomes["completed"]
        await eventually(lambda: load.outcomes["completed"] >= after + 20, "answers after it", within=60)
        load.stop.set()
        stop_watch.set()
        await asyncio.gather(load_task, watch_task)

        assert forward[0] == 0, forward[1]
        assert back[0] == 0, back[1]
        # continuous load across both: zero failed, zero truncated
        assert load.outcomes["completed"] > after_forward > 100, load.outcomes
        assert load.outcomes["failed_before_stream"] == 0, load.problems[:5]
        assert load.outcomes["broken"] == 0, load.problems[:5]
        # never two fingerprints inside one serving group, and the fleet really changed bundle
        assert watch.samples > 20
        assert watch.mixed == []
        assert len({fp for prints in watch.seen.values() for fp in prints}) == 2, watch.seen

        forward_record = orjson.loads(
            (state / "corral" / f"rollout-{url.rsplit(':', 1)[1]}.json").read_bytes()
        )
        # both records complete (tests/integration/test_rollout_record.py): counters, memory, rollback point
        port, first = url.rsplit(":", 1)[1], {e["name"] for e in fleet["engines"]}
        forward_path, back_path = (
            state / "corral" / f"{kind}-{port}.json" for kind in ("rollout", "rollback")
        )
        forward_typed = check_complete_record(forward_path, after_forward - before_forward, first, port)
        second = {m.replaced_by or m.engine for m in forward_typed.memory}
        back_typed = check_complete_record(back_path, after_back - after_forward, second, port)
        assert back_typed.rollback_point is not None and back_typed.rollback_point.undoes == str(forward_path)
        back_record = orjson.loads((state / "corral" / f"rollback-{url.rsplit(':', 1)[1]}.json").read_bytes())
        for record, target in ((forward_record, "v2"), (back_record, "initial")):
            assert record["outcome"] == "succeeded", record["reason"]
            assert record["to_bundle"]["name"] == target
            steps = [(s["step"], s["ok"]) for s in record["steps"]]
            per_group = ["START", "VERIFY", "ROUTED", "DRAIN", "RETIRE", "GONE"]
            assert steps[0][0] == "PRECHECK" and steps[-1][0] == "POSTCHECK"
            assert sorted(s for s, _ in steps) == sorted(["PRECHECK", *per_group, *per_group, "POSTCHECK"])
            assert all(ok for _, ok in steps)
            assert all(s["seconds"] >= 0 and s["started"] > 0 for s in record["steps"])
            assert len(record["replaced"]) == 2
            for move in record["replaced"]:  # each group's steps in order; routed before the drain
                mine = [s for s in record["steps"] if s["group"] in (move["old"], move["new"])]
                assert [s["step"] for s in mine] == per_group, mine
                by_step = {s["step"]: s for s in mine}
                assert by_step["ROUTED"]["started"] <= by_step["DRAIN"]["started"]
            drains = [s for s in record["steps"] if s["step"] == "DRAIN"]
            for drain in drains:  # confirmed: the router acknowledged every removal
                for report in drain["data"]["reports"].values():
                    assert report["routers_missing"] == [] and report["routers_acknowledged"], report
        # forward one group at a time (the second START after the first GONE); back both at once
        forward_starts = [s for s in forward_record["steps"] if s["step"] == "START"]
        first_gone = next(s for s in forward_record["steps"] if s["step"] == "GONE")
        assert forward_starts[1]["started"] >= first_gone["started"] + first_gone["seconds"] - 0.01
        back_starts = [s for s in back_record["steps"] if s["step"] == "START"]
        assert back_starts[1]["started"] < back_starts[0]["started"] + back_starts[0]["seconds"]
        initial = {  # `corral up`'s default bundle is runbook-ready: sleep mode and dev endpoints
            "name": "initial",
            "engine_args": ["--enable-sleep-mode", "--itl-ms=5"],
            "env": {"VLLM_SERVER_DEV_MODE": "1"},
        }
        assert forward_record["from_bundles"] == {g: initial for g in ("g0", "g1")}
        fingerprints = {r["fingerprint"] for r in forward_record["replaced"]}
        assert len(fingerprints) == 1 and fingerprints.isdisjoint(
            {forward_record["fingerprints"][g] for g in ("g0", "g1")}
        )
        # after the rollback, four engines on the first bundle, none of the original processes
        final = fleet_file(state, url)
        assert {e["bundle"] for e in final["engines"]} == {"initial"}
        assert len(final["engines"]) == 4 and old_engines.isdisjoint(e["engine"] for e in final["engines"])
        assert await routable(url) == {e["engine"] for e in final["engines"]}
    finally:
        stop_up(proc)


async def test_a_rollout_whose_bundle_fails_its_smoke_stops_with_the_old_fleet_serving(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "4", "--group-size", "2", *SIM, state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        before = fleet_file(state, url)
        bundle = tmp_path / "broken.yaml"
        bundle.write_text('name: broken\nengine_args: ["--fail-rate", "1.0"]\n')
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        code, output = await corral(
            state, "rollout", "--port", port, "--to", str(bundle), "--start-timeout", "20"
        )
        load.stop.set()
        await load_task

        assert code == 1, output
        record = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
        assert record["outcome"] == "failed"
        # it says why: the step, the group, and the supervisor's own words about the smoke request
        assert record["reason"].startswith("START g0'"), record["reason"]
        assert "not ready yet" in record["reason"] and "smoke" in record["reason"], record["reason"]
        assert "keep serving on their bundle: g0 (initial), g1 (initial)" in record["reason"]
        assert [(s["step"], s["ok"]) for s in record["steps"]] == [("PRECHECK", True), ("START", False)]
        assert "failed" in output and "START" in output
        # the old fleet served every request, before, during and after
        assert load.outcomes["completed"] > 50
        assert load.outcomes["failed_before_stream"] == 0 and load.outcomes["broken"] == 0, load.problems[:5]
        after = fleet_file(state, url)
        assert after["engines"] == before["engines"]
        assert await routable(url) == {e["engine"] for e in before["engines"]}
        # and nothing of the failed group is left running
        for child in descendants(proc.pid):
            with contextlib.suppress(psutil.NoSuchProcess):  # gone between the listing and the look
                cmd = " ".join(child.cmdline())
                assert "--fail-rate" not in cmd or not child.is_running(), cmd
    finally:
        stop_up(proc)


async def test_without_surge_a_failed_group_is_recovered_on_its_old_bundle(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--engines", "4", "--group-size", "2", *SIM, state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        bundle = tmp_path / "broken.yaml"
        bundle.write_text('name: broken\nengine_args: ["--fail-rate", "1.0"]\n')
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        args = ["--max-surge", "0", "--max-unavailable", "1", "--start-timeout", "20"]
        code, output = await corral(state, "rollout", "--port", port, "--to", str(bundle), *args)
        load.stop.set()
        await load_task

        assert code == 1, output
        record = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
        steps = [(s["step"], s["group"], s["ok"]) for s in record["steps"]]
        assert steps[:5] == [
            ("PRECHECK", None, True),
            ("DRAIN", "g0", True),
            ("RETIRE", "g0", True),
            ("GONE", "g0", True),
            ("START", "g0'", False),
        ], steps
        assert steps[5][0] == "RECOVER" and steps[5][2], steps
        assert record["reason"].startswith("START g0'"), record["reason"]
        # the other group carried the load alone while g0 was down: nothing failed
        assert load.outcomes["completed"] > 50
        assert load.outcomes["failed_before_stream"] == 0 and load.outcomes["broken"] == 0, load.problems[:5]
        final = fleet_file(state, url)
        assert len(final["engines"]) == 4 and {e["bundle"] for e in final["engines"]} == {"initial"}
        assert await routable(url) == {e["engine"] for e in final["engines"]}
    finally:
        stop_up(proc)
