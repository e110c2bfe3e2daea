"""A bundle switch moves the preload daemon with its engine (issue 29 item 5; the runbook: "when the daemon
and the engine's vLLM differ, replace the daemon and rebuild its cache first, then start the engine").
Real processes: `corral sim preload` daemons whose `--version-string` differs (the simulator keys its
cache by it, as vLLM's WeightCacheKey holds the version), `corral sim --load-format ipc_cache` engines,
and `corral supervise --bundle FILE` switched through `POST /v1/bundle`."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.integration.test_rollout import corral
from tests.integration.test_rollout_hosts import all_routable
from tests.integration.test_supervisor_confirmed_drain import start_router
from tests.integration.test_supervisor_preload import daemon_command, preload_supervised
from tests.integration.test_supervisor_support import (
    Supervised,
    http_json,
    kill_leftovers,
    short_tmp_dir,
    sim_command,
)
from tests.support.procs import free_port
from tests.support.waits import wait_until

NEW = "0.99.0"  # the upgrade's vLLM: a version no default simulator runs


class Pair:
    """The host: its daemon's health port and socket, and the bundle files declared on it."""

    def __init__(self, tmp_path: Path) -> None:
        self.health_port = free_port()
        self.socket = short_tmp_dir() / "wc.sock"
        self.dir = tmp_path

    def daemon(self, *extra: str) -> str:
        return daemon_command(self.health_port, self.socket, "--startup-seconds", "0.3", *extra)

    def bundle(self, name: str, engine_args: list[str], daemon: str | None) -> Path:
        body: dict[str, Any] = {"name": name, "engine_args": engine_args}
        if daemon is not None:
            body["preload_command"] = shlex.split(daemon)
        path = self.dir / f"{name}.yaml"
        path.write_text(json.dumps(body))  # JSON is YAML
        return path


@contextmanager
def host(pair: Pair, *bundles: Path) -> Iterator[Supervised]:
    args: list[str] = []
    for path in bundles:
        args += ["--bundle", str(path)]
    sup = preload_supervised(pair.daemon(), pair.health_port, pair.socket, "zero_copy", *args)
    try:
        sup.wait_state("READY", 60)
        yield sup
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def switch(sup: Supervised, name: str) -> None:
    status, op = http_json(sup.url + "/v1/bundle", "POST", {"name": name})
    assert status == 202, op


def settled(sup: Supervised, bundle: str) -> dict[str, Any]:
    """READY on `bundle` with no operation holding the engine, and the operation's change record."""
    sup.wait_for(
        f"READY on {bundle}",
        lambda b: b.get("state") == "READY" and b.get("bundle_name") == bundle and not b.get("busy"),
        90,
    )
    records = [r for r in sup.oplog() if r["record"] == "change_record" and r["kind"] == "switch_bundle"]
    assert records, "no change record of the switch"
    return records[-1]


def index(records: list[dict[str, Any]], record: str, after: int = -1, **fields: Any) -> int:
    """The first oplog record of this kind (and fields) after position `after`."""
    for i, r in enumerate(records):
        if i > after and r["record"] == record and all(r.get(k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {record} {fields} after record {after}: {[r['record'] for r in records]}")


def test_an_upgrade_replaces_the_daemon_before_the_engine_starts(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    upgrade = pair.bundle("upgrade", ["--version-string", NEW], pair.daemon("--version-string", NEW))
    with host(pair, upgrade) as sup:
        old = sup.state()["preload"]
        switch(sup, "upgrade")
        record = settled(sup, "upgrade")
        oplog = sup.oplog()
        switched = index(oplog, "bundle_selected", name="upgrade")
        # the runbook's order: engine, then daemon, stopped; the new daemon healthy; then the engine
        engine_gone = index(oplog, "engine_exited", switched)
        old_gone = index(oplog, "preload_stopped", engine_gone, pid=old["pid"])
        new_started = index(oplog, "preload_started", old_gone, version=NEW)
        healthy = index(oplog, "preload_healthy", new_started)
        prechecked = index(oplog, "precheck", healthy, outcome="authorized")
        engine_back = index(oplog, "engine_started", prechecked)
        verified = index(oplog, "preload_verify", engine_back)
        assert oplog[verified]["source"] == "daemon", oplog[verified]  # the Mapped line: from the new cache
        state = sup.state()
        assert state["preload"]["version"] == NEW and state["preload"]["pid"] != old["pid"], state["preload"]
        moved = record["preload"]
        assert moved["replaced"] is True and moved["before"]["version"] == old["version"], moved
        assert moved["after"]["version"] == NEW and moved["after"]["pid"] == state["preload"]["pid"], moved


def test_a_failed_switch_restores_the_old_pair(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    # the daemon is upgraded but the engine is not: PRECHECK refuses the pair (their vLLM differs)
    half = pair.bundle("half", [], pair.daemon("--version-string", NEW))
    with host(pair, half) as sup:
        old = sup.state()["preload"]
        switch(sup, "half")
        record = settled(sup, "initial")
        oplog = sup.oplog()
        refused = index(oplog, "precheck", outcome="refused")
        reason = oplog[refused]["reason"]
        assert "vllm_version" in reason or "version" in reason, oplog[refused]
        # RECOVER: the old daemon back (its command and version), healthy, before the old engine
        back = index(oplog, "preload_started", refused, argv=old["argv"])
        healthy = index(oplog, "preload_healthy", back)
        engine_back = index(oplog, "engine_started", healthy)
        assert oplog[index(oplog, "preload_verify", engine_back)]["source"] == "daemon"
        state = sup.state()
        assert state["preload"]["argv"] == old["argv"] and state["preload"]["version"] == old["version"]
        assert record["outcome"] == "failed", record
        moved = record["preload"]
        assert moved["before"]["version"] == moved["after"]["version"] == old["version"], moved
        assert moved["recovered"]["replaced"] is True, moved


def test_an_unchanged_daemon_is_kept(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    tuned = pair.bundle("tuned", ["--max-num-seqs", "64"], None)  # the host's daemon: same command
    with host(pair, tuned) as sup:
        old = sup.state()["preload"]
        switch(sup, "tuned")
        record = settled(sup, "tuned")
        oplog = sup.oplog()
        switched = index(oplog, "bundle_selected", name="tuned")
        index(oplog, "preload_kept", switched, pid=old["pid"])
        assert not [r for r in oplog[switched:] if r["record"] in ("preload_stopped", "preload_started")]
        started = index(oplog, "engine_started", switched)
        assert oplog[index(oplog, "preload_verify", started)]["source"] == "daemon"
        assert sup.state()["preload"]["pid"] == old["pid"]
        assert record["preload"]["replaced"] is False, record["preload"]


def test_a_bundle_daemon_on_a_host_without_one_is_refused_at_start(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    upgrade = pair.bundle("upgrade", [], pair.daemon())
    supervise = [sys.executable, "-m", "corral", "supervise", "--port", str(free_port())]
    done = subprocess.run(
        [*supervise, "--bundle", str(upgrade), "--", *sim_command(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    # the refusal is the contract: one line naming the value and what to do
    assert "--bundle upgrade: its preload_command needs a host that runs a daemon" in done.stderr, done.stderr
    assert "pass --preload-command" in done.stderr


def test_a_rollback_after_a_failed_start_moves_the_daemon_back_first(tmp_path: Path) -> None:
    """`--on-startup-failure rollback=B` is the same move: a host whose daemon was upgraded but whose
    engine was not fails PRECHECK (their vLLM differs); the rollback bundle's daemon replaces the upgraded
    one before the rolled-back engine starts from it."""
    pair = Pair(tmp_path)
    old = pair.bundle("old", [], pair.daemon())
    sup = preload_supervised(
        pair.daemon("--version-string", NEW),
        pair.health_port,
        pair.socket,
        "zero_copy",
        *("--startup-restarts", "0", "--bundle", str(old), "--on-startup-failure", "rollback=old"),
    )
    try:
        sup.wait_for("READY on old", lambda b: (b.get("state"), b.get("bundle_name")) == ("READY", "old"), 90)
        oplog = sup.oplog()
        upgraded = index(oplog, "preload_started", version=NEW)
        refused = index(oplog, "precheck", upgraded, outcome="refused")
        gone = index(oplog, "preload_stopped", refused, pid=oplog[upgraded]["pid"])
        back = index(oplog, "preload_started", gone)
        assert oplog[back]["version"] != NEW, oplog[back]
        started = index(oplog, "engine_started", index(oplog, "preload_healthy", back))
        assert oplog[index(oplog, "preload_verify", started)]["source"] == "daemon"
        sup.wait_for("the rollback recorded", lambda b: not b.get("busy"), 30)
        (record,) = [r for r in sup.oplog() if r["record"] == "change_record" and r["kind"] == "rollback"]
        moved = record["preload"]
        assert moved["before"]["version"] == NEW, moved
        assert moved["after"]["version"] == oplog[back]["version"], moved
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_a_new_daemon_that_never_gets_healthy_fails_execute_and_the_old_pair_returns(tmp_path: Path) -> None:
    pair = Pair(tmp_path)
    broken = pair.bundle("broken", ["--version-string", NEW], pair.daemon("--no-such-flag"))
    with host(pair, broken) as sup:
        old = sup.state()["preload"]
        switch(sup, "broken")
        record = settled(sup, "initial")
        assert record["outcome"] == "failed", record
        (execute,) = [s for s in record["steps"] if s["step"] == "execute"]
        assert "the preload daemon of bundle broken is not healthy" in execute["data"]["error"], execute
        assert "exited with code 2 before it was healthy" in execute["data"]["error"], execute
        oplog = sup.oplog()
        tried = index(oplog, "preload_started", index(oplog, "bundle_selected", name="broken"))
        assert "--no-such-flag" in oplog[tried]["argv"]
        # no engine of the broken bundle: the old daemon back, healthy, then the old engine
        back = index(oplog, "preload_started", tried, argv=old["argv"])
        assert not [r for r in oplog[tried:back] if r["record"] == "engine_started"]
        started = index(oplog, "engine_started", index(oplog, "preload_healthy", back))
        assert oplog[index(oplog, "preload_verify", started)]["source"] == "daemon"
        assert record["preload"]["after"]["argv"] == old["argv"], record["preload"]


async def test_a_host_rollout_and_its_rollback_move_the_daemon_each_way(tmp_path: Path) -> None:
    """`corral rollout --to` across hosts and `corral rollback` are the supervisor's switch by name: the
    host's declared bundle, with its daemon, is what each moves to."""
    pair = Pair(tmp_path)
    upgrade = pair.bundle("upgrade", ["--version-string", NEW], pair.daemon("--version-string", NEW))
    with host(pair, upgrade) as sup:
        router, url = start_router("router-preload", [sup])
        try:
            router.wait_http(url + "/health")
            wait_until(lambda: all_routable(url, 1), 30, "the router routing the engine")
            fleet = tmp_path / "hosts.yaml"
            fleet.write_text(f"router: {url}\nsupervisors:\n  - {sup.url}\n")
            old = sup.state()["preload"]
            state = tmp_path / "state"
            forward = await corral(state, "rollout", "--fleet", str(fleet), "--to", str(upgrade))
            assert forward[0] == 0, forward[1]
            middle = sup.state()
            assert middle["bundle_name"] == "upgrade", middle["bundle_name"]
            assert middle["preload"]["version"] == NEW, middle["preload"]
            back = await corral(state, "rollback", "--fleet", str(fleet))
            assert back[0] == 0, back[1]
            now = sup.state()
            assert now["bundle_name"] == "initial", now["bundle_name"]
            assert now["preload"]["argv"] == old["argv"] and now["preload"]["version"] == old["version"]
            assert now["preload"]["pid"] not in (old["pid"], middle["preload"]["pid"])
            moves = [r["preload"] for r in sup.oplog() if r["record"] == "change_record" and r.get("preload")]
            assert [(m["before"]["version"], m["after"]["version"]) for m in moves] == [
                (old["version"], NEW),
                (NEW, old["version"]),
            ], moves
        finally:
            router.stop()
