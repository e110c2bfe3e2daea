"""`corral rollout` across hosts listed with their supervisor URLs (processes Corral does not start):
each supervisor switches its engine in place to a bundle declared on it, one at a time, under
continuous load through a router, and `corral rollback` switches back; a bundle a host has not
declared is refused before anything moves, and a bundle whose smoke fails is undone by the
supervisor's RECOVER."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import orjson
import pytest

from tests.integration.test_rollout import Load, corral, routable
from tests.integration.test_supervisor_confirmed_drain import start_router
from tests.integration.test_supervisor_support import Supervised, kill_leftovers, start_supervised
from tests.support.span_sink import attribute, span_sink
from tests.support.waits import eventually, wait_until

SIM = ("--itl-ms", "5")
SUP = ("--propagation-timeout", "5", "--quiet-period", "0.3", "--drain-timeout", "15")


@contextmanager
def hosts(
    tmp_path: Path, count: int = 2, more: tuple[Path, ...] = (), kv_roles: tuple[str, ...] = ()
) -> Iterator[tuple[list[Supervised], str, Path]]:
    """`count` supervised sims that declare bundles v2 and broken (and the bundle files `more`), a
    router over them, a fleet file; with `kv_roles`, one sim per vLLM kv_role instead (a P/D fleet)."""
    (tmp_path / "v2.yaml").write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\n')
    (tmp_path / "broken.yaml").write_text('name: broken\nengine_args: ["--fail-rate", "1.0"]\n')
    declared = ("--bundle", str(tmp_path / "v2.yaml"), "--bundle", str(tmp_path / "broken.yaml"))
    declared += tuple(arg for path in more for arg in ("--bundle", str(path)))
    with ExitStack() as stack:
        sups: list[Supervised] = []
        for kv_role in kv_roles or (None,) * count:
            kv = ("--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role}))
            sim_args = (*SIM, *kv) if kv_role else SIM
            sup = start_supervised(sim_args=sim_args, sup_args=(*SUP, "--bundle-name", "v1", *declared))
            sups.append(sup)

            def stop(sup: Supervised = sup) -> None:
                pids = sup.engine_pids()
                sup.proc.stop(grace=20)
                kill_leftovers(pids)

            stack.callback(stop)
        router, url = start_router("router-hosts", sups)
        stack.callback(router.stop)
        for sup in sups:
            sup.wait_state("READY", 60)
        router.wait_http(url + "/health")
        wait_until(lambda: all_routable(url, len(sups)), 30, "the router routing every engine")
        fleet = tmp_path / "hosts.yaml"
        fleet.write_text(f"router: {url}\nsupervisors:\n" + "".join(f"  - {s.url}\n" for s in sups))
        yield sups, url, fleet


def all_routable(url: str, count: int) -> bool:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2) as resp:
        body = orjson.loads(resp.read())
    return sum(1 for e in body["endpoints"] if e["routable"]) == count


def record(state: Path, kind: str, url: str) -> dict:  # type: ignore[type-arg]
    body: dict = orjson.loads((state / "corral" / f"{kind}-{url.rsplit(':', 1)[1]}.json").read_bytes())  # type: ignore[type-arg]
    return body


async def test_hosts_are_switched_in_place_and_back_under_load(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with hosts(tmp_path) as (sups, url, fleet), span_sink() as sink:
        before = {s.url: s.state()["bundle"]["fingerprint"] for s in sups}
        engine_pids = {s.url: s.state()["engine"]["pid"] for s in sups}
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        to_v2 = ("--to", str(tmp_path / "v2.yaml"), "--otlp-traces-endpoint", sink.url)
        forward = await corral(state, "rollout", "--fleet", str(fleet), *to_v2)
        middle = {s.url: s.state() for s in sups}
        back = await corral(state, "rollback", "--fleet", str(fleet))
        after = load.outcomes["completed"]
        await eventually(lambda: load.outcomes["completed"] >= after + 20, "answers after it", within=60)
        load.stop.set()
        await load_task

        assert forward[0] == 0, forward[1]
        assert back[0] == 0, back[1]
        assert load.outcomes["completed"] > 100, load.outcomes
        assert load.outcomes["failed_before_stream"] == 0 and load.outcomes["broken"] == 0, load.problems[:5]
        # every host ran v2 with a new fingerprint in between, on a new engine process
        for sup in sups:
            assert middle[sup.url]["bundle_name"] == "v2"
            assert middle[sup.url]["bundle"]["fingerprint"] != before[sup.url]
            assert middle[sup.url]["engine"]["pid"] != engine_pids[sup.url]
            now = sup.state()
            assert now["bundle_name"] == "v1" and now["bundle"]["fingerprint"] == before[sup.url]
        forward_record, back_record = record(state, "rollout", url), record(state, "rollback", url)
        for rec, target in ((forward_record, "v2"), (back_record, "v1")):
            assert rec["outcome"] == "succeeded", rec["reason"]
            per_host = ["SWITCH", "VERIFY", "ROUTED"]
            assert [s["step"] for s in rec["steps"]] == ["PRECHECK", *per_host, *per_host, "POSTCHECK"]
            assert rec["to_bundle"]["name"] == target
            switches = [s for s in rec["steps"] if s["step"] == "SWITCH"]
            for switch in switches:  # the supervisor's runbook, every step in order
                names = [name for name, status, _ in switch["data"]["steps"]]
                assert names == [
                    "precheck",
                    "remove_from_routing",
                    "drain_policy",
                    "execute",
                    "verify",
                    "postcheck",
                ], names
            # one host at a time: the second switch began after the first host was routed again
            routed = [s for s in rec["steps"] if s["step"] == "ROUTED"]
            assert routed[0]["started"] + routed[0]["seconds"] <= switches[1]["started"] + 0.01
        assert forward_record["from_bundles"] == {
            "host-0": {"name": "v1", "engine_args": [], "env": {}},
            "host-1": {"name": "v1", "engine_args": [], "env": {}},
        }
        assert await routable(url) == {s.engine_url for s in sups}
        # the rollout (traced) is one trace, a span per step of each group, named in its record
        spans = [span for span in sink.spans if span["traceId"] == forward_record["trace_id"]]
        (root,) = [span for span in spans if "parentSpanId" not in span]
        assert root["name"].startswith("rollout") and attribute(root, "corral.bundle.to") == "v2"
        steps = [
            (attribute(span, "corral.step"), attribute(span, "corral.group"))
            for span in spans
            if span is not root
        ]
        assert sorted(steps, key=str) == sorted(
            ((s["step"], s["group"]) for s in forward_record["steps"]), key=str
        )
        assert all(span["parentSpanId"] == root["spanId"] for span in spans if span is not root)
        assert back_record.get("trace_id") is None  # the rollback was not traced


async def test_an_undeclared_bundle_is_refused_before_anything_moves(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "v3.yaml").write_text("name: v3\n")
    with hosts(tmp_path) as (sups, url, fleet):
        pids = {s.url: s.state()["engine"]["pid"] for s in sups}
        code, output = await corral(
            state, "rollout", "--fleet", str(fleet), "--to", str(tmp_path / "v3.yaml")
        )
        assert code == 1, output
        rec = record(state, "rollout", url)
        assert [(s["step"], s["ok"]) for s in rec["steps"]] == [("PRECHECK", False)]
        assert (
            "bundle 'v3' is not declared on host-0" in rec["reason"]
            and "add `--bundle FILE`" in rec["reason"]
        )
        assert {s.url: s.state()["engine"]["pid"] for s in sups} == pids
        assert all(s.state()["state"] == "READY" for s in sups)


@pytest.mark.timeout(240)
async def test_a_prefill_decode_host_fleet_switches_a_pair_at_a_time(tmp_path: Path) -> None:
    """Two prefill and two decode hosts to a new vLLM version (a new pairing identity): with
    --min-decode 2 PRECHECK refuses before anything moves (hosts have no spare to surge into); without,
    each wave is a prefill host then a decode host, between PAIRS checks of the router's fleet that
    each find a complete pair, and every host reports the target's identity at the end."""
    state = tmp_path / "state"
    roles = ("kv_producer", "kv_producer", "kv_consumer", "kv_consumer")
    with hosts(tmp_path, kv_roles=roles) as (sups, url, fleet):
        assert [s.state()["role"] for s in sups] == ["prefill", "prefill", "decode", "decode"]
        before = {s.state()["pairing"] for s in sups}
        pids = {s.url: s.state()["engine"]["pid"] for s in sups}
        to = ("--fleet", str(fleet), "--to", str(tmp_path / "v2.yaml"))
        code, output = await corral(state, "rollout", *to, "--min-decode", "2")
        assert code == 1, output
        refused = record(state, "rollout", url)
        assert [(s["step"], s["ok"]) for s in refused["steps"]] == [("PRECHECK", False)]
        assert "below --min-decode 2: hosts are switched in place" in refused["reason"], refused["reason"]
        assert {s.url: s.state()["engine"]["pid"] for s in sups} == pids
        code, output = await corral(
            state, "rollout", "--fleet", str(fleet), "--to", str(tmp_path / "v2.yaml")
        )
        assert code == 0, output
        rec = record(state, "rollout", url)
        assert rec["outcome"] == "succeeded", rec["reason"]
        moves = [(s["step"], s["group"]) for s in rec["steps"] if s["step"] in ("PAIRS", "SWITCH")]
        assert moves == [
            ("PAIRS", "wave 1"),
            ("SWITCH", "host-0"),
            ("SWITCH", "host-2"),
            ("PAIRS", "wave 1"),
            ("PAIRS", "wave 2"),
            ("SWITCH", "host-1"),
            ("SWITCH", "host-3"),
            ("PAIRS", "wave 2"),
        ], moves
        pairs = [s["data"] for s in rec["steps"] if s["step"] == "PAIRS"]
        assert all(len(p["pairs"]) >= 1 for p in pairs), pairs
        assert len(pairs[1]["pairs"]) == 2  # after wave 1: the old pair and the new one
        after = {s.state()["pairing"] for s in sups}
        assert len(before) == 1 and len(after) == 1 and before != after


@pytest.mark.timeout(240)
async def test_a_bundle_that_fails_its_smoke_is_undone_by_the_supervisor(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with hosts(tmp_path) as (sups, url, fleet):
        before = sups[0].state()["bundle"]["fingerprint"]
        load = Load(url)
        load_task = asyncio.create_task(load.run())
        await eventually(lambda: load.outcomes["completed"] >= 20, "load flowing", within=60)
        code, output = await corral(
            state,
            "rollout",
            "--fleet",
            str(fleet),
            "--to",
            str(tmp_path / "broken.yaml"),
            "--start-timeout",
            "15",
        )
        load.stop.set()
        await load_task

        assert code == 1, output
        rec = record(state, "rollout", url)
        assert [(s["step"], s["ok"]) for s in rec["steps"]] == [("PRECHECK", True), ("SWITCH", False)]
        assert "switch_bundle failed at verify" in rec["reason"], rec["reason"]
        assert "back on v1, READY again" in rec["reason"], rec["reason"]
        assert "host-1 (v1)" in rec["reason"]  # the host not reached keeps its bundle, and says so
        # the other host served every request while the first was out
        assert load.outcomes["failed_before_stream"] == 0 and load.outcomes["broken"] == 0, load.problems[:5]
        for sup in sups:
            now = sup.wait_state("READY", 30)
            assert now["bundle_name"] == "v1"
        assert sups[0].state()["bundle"]["fingerprint"] == before
        oplog = [r for r in sups[0].oplog() if r["record"] == "runbook_step" and r["kind"] == "switch_bundle"]
        assert [(r["step"], r["status"]) for r in oplog] == [
            ("precheck", "done"),
            ("remove_from_routing", "done"),
            ("drain_policy", "done"),
            ("execute", "done"),
            ("verify", "failed"),
            ("recover", "done"),
        ]


async def test_one_host_is_switched_from_the_cli_and_an_undeclared_name_changes_nothing(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with hosts(tmp_path, count=1) as (sups, _, _):
        (sup,) = sups
        pid = sup.state()["engine"]["pid"]
        code, output = await corral(state, "switch-bundle", "--supervisor", sup.url, "nope")
        assert code == 2, output
        assert "bundle 'nope' is not declared on this host (declared: broken, v1, v2)" in output, output
        assert sup.state()["engine"]["pid"] == pid and sup.state()["bundle_name"] == "v1"

        code, output = await corral(state, "switch-bundle", "--supervisor", sup.url, "v2")
        assert code == 0, output
        now = sup.state()
        assert now["state"] == "READY" and now["bundle_name"] == "v2" and now["engine"]["pid"] != pid
        assert "--version-string" in now["engine"]["argv"]
        code, output = await corral(state, "switch-bundle", "--supervisor", sup.url, "v2")
        assert code == 2 and "already runs bundle 'v2'" in output, output
