"""`corral up` as a user runs it: one command, a URL printed, the OpenAI SDK working against it, and a
Ctrl-C that leaves no process behind — even when an engine will not exit on SIGTERM."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import psutil
import pytest
from openai import OpenAI

from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until


def start_up(*extra: str, state_home: Path | None = None) -> tuple[CorralProcess, str]:
    port = free_port()
    env = {"XDG_STATE_HOME": str(state_home)} if state_home else None
    proc = CorralProcess(["up", "--port", str(port), *extra], env=env)
    wait_until(lambda: "router: " in proc.output() or proc.proc.poll() is not None, 90, "the router URL")
    match = re.search(r"router: (http://\S+)", proc.output())
    # the printed line is the contract: it tells the person where to connect
    assert match, proc.output()
    return proc, match.group(1)


def local_fleet_file_under(state_home: Path, port: int) -> Path:
    return state_home / "corral" / f"up-{port}.json"


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_up_prints_a_url_that_serves_the_openai_sdk() -> None:
    proc, url = start_up("--engines", "2")
    try:
        assert url.endswith(str(proc.args[2]))
        # the printed answer is the contract: what the person who ran the command reads
        assert "curl -s" in proc.output()
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        models = [m.id for m in client.models.list()]
        assert models == ["sim-model"]
        reply = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello"}], max_tokens=5, temperature=0
        )
        assert reply.choices[0].message.content
        assert reply.choices[0].finish_reason in {"length", "stop"}
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        chunks = list(
            client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        assert chunks[-1].usage is not None
        fleet = httpx.get(url + "/v1/fleet").json()
        assert sum(1 for e in fleet["endpoints"] if e["routable"]) == 2
        # the router follows each engine's supervisor (drains are acknowledged, not timed)
        assert all(e["supervisor"]["stream"] == "connected" for e in fleet["endpoints"])
    finally:
        children = descendants(proc.pid)
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(30) == 0, proc.output()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_a_drain_in_a_local_fleet_is_acknowledged_by_its_router(tmp_path: Path) -> None:
    proc, url = start_up("--engines", "2", state_home=tmp_path)
    try:
        port = int(url.rsplit(":", 1)[1])
        fleet = orjson.loads(local_fleet_file_under(tmp_path, port).read_bytes())
        engines, supervisor = fleet["engines"], fleet["engines"][0]["supervisor"]
        # the fleet's own management token: every supervisor of a `corral up` fleet wants it
        auth = {"Authorization": "Bearer " + Path(fleet["supervisor_token_file"]).read_text().strip()}

        def subscribed() -> dict[str, int]:
            return dict(httpx.get(supervisor + "/v1/state", headers=auth).json()["routers"]["subscribed"])

        wait_until(
            lambda: subscribed() == {"local-router": 1},
            10,
            "the router's subscription",
        )
        assert httpx.post(supervisor + "/v1/drain", json={}).status_code == 401
        assert httpx.post(supervisor + "/v1/drain", json={}, headers=auth).status_code == 202
        wait_until(
            lambda: httpx.get(supervisor + "/v1/state", headers=auth).json()["drain"] is not None,
            30,
            "the drain",
        )
        drain = httpx.get(supervisor + "/v1/state", headers=auth).json()["drain"]
        assert [a["router_id"] for a in drain["routers_acknowledged"]] == ["local-router"]
        assert drain["routers_missing"] == []
        fleet = httpx.get(url + "/v1/fleet").json()
        assert [e["routable"] for e in fleet["endpoints"] if e["url"] == engines[0]["engine"]] == [False]
    finally:
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(30) == 0, proc.output()


def test_ctrl_c_kills_an_engine_that_will_not_exit(tmp_path: Path) -> None:
    # after its smoke request the engine hangs every request; with shutdown-timeout 0 and a request
    # in flight it never exits on SIGTERM (like the real vLLM capture). `up` gives its members 2 s,
    # less than the supervisor's own drain, so it must escalate to SIGKILL, and the engine must go too.
    proc, url = start_up(
        "--engines", "1", "--stop-grace", "2", "--sim-arg=--hang-after=1", state_home=tmp_path
    )
    port = int(url.rsplit(":", 1)[1])
    fleet = orjson.loads(local_fleet_file_under(tmp_path, port).read_bytes())
    engine_url = fleet["engines"][0]["engine"]
    children = descendants(proc.pid)
    assert len(children) >= 3  # supervisor, engine, router

    def hold_a_request() -> None:
        try:  # straight to the engine: a client the router cannot close for us
            httpx.post(
                engine_url + "/v1/completions",
                json={"model": "sim-model", "prompt": "x", "max_tokens": 4},
                timeout=20,
            )
        except httpx.HTTPError:
            pass

    holder = threading.Thread(target=hold_a_request, daemon=True)
    holder.start()
    wait_until(
        lambda: (
            "vllm:num_requests_running{" in (m := httpx.get(engine_url + "/metrics").text)
            and any(
                line.startswith("vllm:num_requests_running{") and not line.endswith(" 0.0")
                for line in m.splitlines()
            )
        ),
        10,
        "the held request to be running on the engine",
    )
    started = time.monotonic()
    proc.signal(signal.SIGINT)
    assert proc.wait_exit(30) == 0, proc.output()
    assert time.monotonic() - started < 30
    survivors = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, [c.cmdline() for c in survivors]
    assert not local_fleet_file_under(tmp_path, port).exists()


def test_up_reports_a_failed_start_and_cleans_up() -> None:
    proc = CorralProcess(["up", "--port", str(free_port()), "--sim-arg=--requires=file:/nonexistent/kv.sock"])
    code = proc.wait_exit(60)
    out = proc.output()
    assert code == 1, out
    # the printed answer is the contract: what the person who ran the command reads
    assert re.search(r"engine-\d failed: ", out), out
    assert "/nonexistent/kv.sock" in out


def test_a_bundle_fingerprint_is_expected_by_every_supervisor_of_its_group(tmp_path: Path) -> None:
    """A bundle's `fingerprint:` pins the group: another is refused at PRECHECK, before the engine
    starts; the fingerprint PRECHECK computed brings the same group to READY on it."""
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text('name: pinned\nfingerprint: "0000000000000000"\n')
    group = ["--engines", "2", "--group-size", "2"]
    refused = CorralProcess(["up", "--port", str(free_port()), *group, "--bundle", str(wrong)])
    wait_until(lambda: "router: " in refused.output() or refused.proc.poll() is not None, 60, "an outcome")
    if refused.proc.poll() is None:
        refused.stop()
        pytest.fail(f"the fleet started on a bundle that is not its fingerprint:\n{refused.output()}")
    out = refused.output()
    assert refused.proc.returncode == 1, out
    match = re.search(
        r"engine-\d failed: PRECHECK refused the start: artifact_identity: fingerprint ([0-9a-f]{16}) "
        r"is not the expected 0000000000000000 \(--expect-fingerprint\)",
        out,
    )
    assert match, out
    actual = match.group(1)
    right = tmp_path / "right.yaml"
    right.write_text(f'name: pinned\nfingerprint: "{actual}"\n')
    proc, url = start_up(*group, "--bundle", str(right))
    try:
        fleet = httpx.get(url + "/v1/fleet").json()
        assert [(e["routable"], e["supervisor"]["fingerprint"]) for e in fleet["endpoints"]] == [
            (True, actual),
            (True, actual),
        ]
    finally:
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(30) == 0, proc.output()


@pytest.mark.parametrize("bad", [["--engines", "0"], ["--policy", "nope"]])
def test_up_rejects_bad_options(bad: list[str]) -> None:
    proc = CorralProcess(["up", *bad])
    assert proc.wait_exit(30) == 2
    # the refusal is the contract: one line naming the value and what to do
    assert "Invalid value" in proc.output()


def test_status_shows_every_engine_of_a_local_fleet(tmp_path: Path) -> None:
    proc, url = start_up("--engines", "2", state_home=tmp_path)
    env = {"XDG_STATE_HOME": str(tmp_path), "COLUMNS": "200"}
    try:
        port = url.rsplit(":", 1)[1]
        shown = CorralProcess(["status", "--port", port], env=env)
        assert shown.wait_exit(30) == 0, shown.output()
        out = shown.output()
        # the printed answer is the contract: what the person who ran the command reads
        assert out.count("READY") >= 2 and "engine-0" in out and "engine-1" in out, out
        assert out.count("routable") >= 2, out
    finally:
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(60) == 0, proc.output()
    gone = CorralProcess(["status", "--port", port], env=env)
    assert gone.wait_exit(30) == 1
    assert "no local fleet on port" in gone.output()
