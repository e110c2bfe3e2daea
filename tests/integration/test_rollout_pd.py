"""`corral rollout` and `corral rollback` of a prefill/decode fleet (`corral up --prefill 2 --decode 2`)
to a bundle on another vLLM version (so the pairing identity changes), under continuous streamed and
non-streamed load through the router's P/D path: zero failed requests and zero cut streams, every
decode leg the router sent paired two engines of one fingerprint, a complete compatible pair routable
at every sampled moment, no engine stopped while it held a transfer nobody pulled; and PRECHECK
refusing a plan that would leave no decode engine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from corral.engine.metrics_text import samples
from tests.integration.test_rollout import Load, corral, fleet_file, stop_up
from tests.integration.test_up import start_up
from tests.support.waits import eventually

SIM = ("--sim-arg=--itl-ms=5",)
MODEL = "sim-model"


@dataclass
class PairWatch:
    """Samples the router: /v1/fleet (each endpoint's fingerprint, the model's routable pairs) and its
    /metrics (the (prefill, decode) pairs its decode legs went to)."""

    router: str
    fingerprints: dict[str, set[str]] = field(default_factory=dict)  # engine URL -> fingerprints seen
    pairs_seen: list[int] = field(default_factory=list)  # the model's routable pairs, per sample
    no_pair: list[str] = field(default_factory=list)
    legs: dict[tuple[str, str], float] = field(default_factory=dict)  # (prefill, decode) -> decode legs

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            n = 0
            while not stop.is_set():
                async with session.get(self.router + "/v1/fleet") as resp:
                    body = await resp.json()
                for e in body["endpoints"]:
                    printed = (e.get("supervisor") or {}).get("fingerprint")
                    if printed:
                        self.fingerprints.setdefault(e["url"], set()).add(printed)
                pairs = next((p for p in body.get("pairs") or [] if p["model"] == MODEL), None)
                self.pairs_seen.append(pairs["pairs"] if pairs else 0)
                if not pairs or pairs["pairs"] < 1:
                    self.no_pair.append(str(pairs))
                if n % 5 == 0:
                    await self.read_legs(session)
                n += 1
                await asyncio.sleep(0.05)
            await self.read_legs(session)

    async def read_legs(self, session: aiohttp.ClientSession) -> None:
        async with session.get(self.router + "/metrics") as resp:
            text = await resp.text()
        for s in samples(text, {"corral_router_pd_pairs_total"}):
            self.legs[(s.labels["prefill"], s.labels["decode"])] = s.value


def _steps(record: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [s for s in record["steps"] if s["step"] == name]


def roles_of(fleet: dict[str, Any]) -> dict[str, str]:
    """Serving group -> role, from a fleet file."""
    return {e["group"]: e["role"] for e in fleet["engines"]}


def check_record(record: dict[str, Any], target: str, roles: dict[str, str], per_wave: int) -> None:
    """Succeeded, in waves of `per_wave` prefill and as many decode groups, every PAIRS step passed
    with a complete pair and an engine of each role usable, and in each wave the old prefill groups'
    drains ended before the old decode groups' began."""
    assert record["outcome"] == "succeeded", record["reason"]
    assert record["to_bundle"]["name"] == target
    assert all(s["ok"] for s in record["steps"]), [s for s in record["steps"] if not s["ok"]]
    plan = _steps(record, "PRECHECK")[0]["data"]["plan"]
    waves = 2 // per_wave
    assert [(w["together"], len(w["groups"])) for w in plan] == [(True, 2 * per_wave)] * waves, plan
    pairs = _steps(record, "PAIRS")
    assert [p["data"]["when"] for p in pairs] == ["without the old groups", "after the wave"] * waves
    for p in pairs:
        assert p["data"]["pairs"] and p["data"]["usable_prefill"] >= 1 and p["data"]["usable_decode"] >= 1
    drains = _steps(record, "DRAIN")
    for w in range(waves):
        wave = drains[2 * per_wave * w : 2 * per_wave * (w + 1)]
        prefill = [d for d in wave if roles[d["group"]] == "prefill"]
        decode = [d for d in wave if roles[d["group"]] == "decode"]
        assert len(prefill) == len(decode) == per_wave, wave
        assert max(d["started"] + d["seconds"] for d in prefill) <= min(d["started"] for d in decode) + 0.01
    for drain in drains:
        for report in drain["data"]["reports"].values():
            assert report["routers_missing"] == [], report
            transfers = report.get("transfers")
            assert transfers is not None, report  # the drain looked at the engine's transfers
            # stopped only once every transfer it held was pulled (the sim's held gauge at 0, none
            # expired) and every pull it made had finished
            assert transfers["ended"] == "clear" and transfers["held_at_end"] == 0, transfers
            assert not transfers["timed_out"] and not transfers["pulls_at_end"], transfers


async def test_a_pd_fleet_rolls_out_and_back_keeping_a_coherent_pair(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--prefill", "2", "--decode", "2", *SIM, state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        fleet = fleet_file(state, url)
        assert sorted(e["role"] for e in fleet["engines"]) == ["decode", "decode", "prefill", "prefill"]
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--itl-ms", "5", "--version-string", "0.33.1"]\n')
        load, watch = Load(url), PairWatch(url)
        stop_watch = asyncio.Event()
        load_task = asyncio.create_task(load.run())
        watch_task = asyncio.create_task(watch.run(stop_watch))
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        forward = await corral(state, "rollout", "--port", port, "--to", str(bundle))
        after_forward = load.total
        middle = fleet_file(state, url)
        back = await corral(state, "rollback", "--port", port, "--max-surge", "2")
        after = load.outcomes["completed"]
        await eventually(lambda: load.outcomes["completed"] >= after + 20, "answers after it", within=60)
        load.stop.set()
        stop_watch.set()
        await asyncio.gather(load_task, watch_task)

        assert forward[0] == 0, forward[1][-3000:]
        assert back[0] == 0, back[1][-3000:]
        assert load.outcomes["completed"] > after_forward > 100, load.outcomes
        assert load.outcomes["failed_before_stream"] == 0, load.problems[:5]
        assert load.outcomes["broken"] == 0, load.problems[:5]
        # a complete compatible pair at every sampled moment
        assert len(watch.pairs_seen) > 20 and watch.no_pair == [], watch.no_pair[:3]
        # every decode leg paired two engines of one fingerprint, and both bundles carried traffic
        assert all(len(prints) == 1 for prints in watch.fingerprints.values()), watch.fingerprints
        print_of = {u: next(iter(p)) for u, p in watch.fingerprints.items()}
        mixed = [(p, d) for p, d in watch.legs if print_of.get(p) is None or print_of[p] != print_of.get(d)]
        assert mixed == [], (mixed, print_of)
        assert len({print_of[p] for (p, _), n in watch.legs.items() if n}) == 2, watch.legs

        # forward one prefill and one decode group at a time, back all four at once
        for kind, target, was, per_wave in (("rollout", "v2", fleet, 1), ("rollback", "initial", middle, 2)):
            record = orjson.loads((state / "corral" / f"{kind}-{port}.json").read_bytes())
            check_record(record, target, roles_of(was), per_wave)
        final = fleet_file(state, url)
        assert {e["bundle"] for e in final["engines"]} == {"initial"}
        assert sorted(e["role"] for e in final["engines"]) == ["decode", "decode", "prefill", "prefill"]
    finally:
        stop_up(proc)


async def test_precheck_refuses_a_plan_that_leaves_no_decode_engine(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc, url = start_up("--prefill", "1", "--decode", "1", *SIM, state_home=state)
    port = url.rsplit(":", 1)[1]
    try:
        before = fleet_file(state, url)
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\n')
        args = ["--max-surge", "0", "--max-unavailable", "1"]
        code, output = await corral(state, "rollout", "--port", port, "--to", str(bundle), *args)
        assert code == 1, output
        record = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
        assert [(s["step"], s["ok"]) for s in record["steps"]] == [("PRECHECK", False)]
        assert "would leave no complete compatible pair routable" in record["reason"], record["reason"]
        assert "use --max-surge" in record["reason"], record["reason"]
        assert fleet_file(state, url)["engines"] == before["engines"]  # nothing moved
    finally:
        stop_up(proc)
