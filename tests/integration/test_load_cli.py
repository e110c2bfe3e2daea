"""`corral load` against a router and simulated engines on loopback: the count it reports matches the
engines' own counters, a killed engine's failures are counted by kind (exit 1), Ctrl-C stops it with a
summary, and bad options or an unreachable router are a one-line error (exit 2)."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from corral.engine.metric_names import FINISHED
from corral.fleet.load.driver import MAX_IN_FLIGHT, LoadPlan, run_load
from tests.integration.test_router_passthrough import SIM_ARGS, start_router
from tests.support import hostile_engine
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.prom import sample, scrape
from tests.support.waits import wait_until

SUMMARY = re.compile(
    r"^load (done|stopped by Ctrl-C): sent (\d+) .* ok (\d+), failed (\d+)(?: \((.*)\))?"
    r"(?:, \d+ unfinished at Ctrl-C)?; latency",
    re.M,
)
PROGRESS_OK = re.compile(r"^\s+\d+s  sent \d+  ok [1-9]\d*  ", re.M)
KINDS = re.compile(
    r"(HTTP \d{3}|connection error|connection closed|stream cut|stream error event|answer cut|timeout) ×\d+"
)


def corral_load(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "load", *args], capture_output=True, text=True, timeout=120
    )


def finished_on(sim_url: str) -> int:
    """The requests an engine says it finished (every finished_reason)."""
    text = scrape(sim_url + "/metrics")
    return int(
        sum(sample(text, FINISHED, finished_reason=r) or 0 for r in ("stop", "length", "abort", "error"))
    )


def test_load_reports_no_failure_and_the_count_the_engines_served() -> None:
    sims = [start_sim(None, *SIM_ARGS) for _ in range(2)]
    router, url = start_router(*(u for _, u in sims))
    try:
        done = corral_load("--router", url, "--rate", "40", "--seconds", "2", "--stream-share", "0.5")
        assert done.returncode == 0, done.stdout + done.stderr
        # the printed answer is the contract: what the person who ran the command reads
        found = SUMMARY.search(done.stdout)
        assert found is not None, done.stdout
        sent, ok, failed = int(found[2]), int(found[3]), int(found[4])
        assert failed == 0 and ok == sent > 0
        assert sum(finished_on(u) for _, u in sims) == sent
        assert f"{sent // 2} streamed" in done.stdout or f"{(sent + 1) // 2} streamed" in done.stdout

        # bounded in count: --max-requests stops it before its time is up
        capped = corral_load("--router", url, "--concurrency", "4", "--seconds", "60", "--max-requests", "25")
        assert capped.returncode == 0, capped.stdout + capped.stderr
        found = SUMMARY.search(capped.stdout)
        assert found is not None and found[2] == "25" and found[3] == "25", capped.stdout
        assert sum(finished_on(u) for _, u in sims) == sent + 25
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()


def test_load_counts_the_failures_by_kind_when_the_only_engine_is_killed() -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url)
    load = CorralProcess(
        ["load", "--router", url, "--concurrency", "4", "--seconds", "60", "--max-requests", "3000"]
    )
    try:
        wait_until(lambda: PROGRESS_OK.search(load.output()) is not None, 30, "the load's first ok requests")
        sim.signal(signal.SIGKILL)
        assert load.wait_exit(120) == 1, load.output()
        # the printed answer is the contract: what the person who ran the command reads
        found = SUMMARY.search(load.output())
        assert found is not None, load.output()
        assert int(found[4]) > 0 and int(found[3]) > 0
        kinds = found[5]
        assert kinds and KINDS.fullmatch(kinds.split(", ")[0]), kinds
        assert all(KINDS.fullmatch(kind) for kind in kinds.split(", ")), kinds
    finally:
        load.stop()
        router.stop()
        sim.stop()


def test_ctrl_c_stops_the_load_and_prints_the_summary() -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url)
    load = CorralProcess(["load", "--router", url, "--rate", "20", "--seconds", "300"])
    try:
        wait_until(lambda: PROGRESS_OK.search(load.output()) is not None, 30, "the load's first ok requests")
        load.signal(signal.SIGINT)
        assert load.wait_exit(60) == 0, load.output()
        # the printed answer is the contract: what the person who ran the command reads
        found = SUMMARY.search(load.output())
        assert found is not None and found[1] == "stopped by Ctrl-C" and found[4] == "0", load.output()
        assert "Traceback" not in load.output()
    finally:
        load.stop()
        router.stop()
        sim.stop()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--rate", "0"), "--rate 0.0 must be a number above 0"),
        (("--rate", "-3"), "--rate -3.0 must be a number above 0"),
        (("--rate", "nan"), "--rate nan must be a number above 0"),
        (("--rate", "inf"), "--rate inf must be a number above 0"),
        (("--seconds", "0"), "--seconds 0.0 must be a number above 0"),
        (("--seconds", "-1"), "--seconds -1.0 must be a number above 0"),
        (("--stream-share", "1.5"), "--stream-share 1.5 must be between 0 and 1"),
        (("--stream-share", "-0.1"), "--stream-share -0.1 must be between 0 and 1"),
        (("--stream-share", "nan"), "--stream-share nan must be between 0 and 1"),
        (("--concurrency", "0"), "--concurrency 0 must be 1 to 512"),
        (("--concurrency", "4", "--rate", "5"), "--rate and --concurrency both given"),
        (("--max-requests", "0"), "--max-requests 0 must be 1 or more"),
        (("--timeout", "0"), "--timeout 0.0 must be a number above 0"),
        (("--timeout", "nan"), "--timeout nan must be a number above 0"),
        (("--router", "ftp://127.0.0.1:1"), "is not an http(s) URL"),
        (("--router", "127.0.0.1:8000"), "is not an http(s) URL"),
        (("--api-key-file", "/nonexistent/key"), "--api-key-file '/nonexistent/key' is unreadable"),
    ],
)
def test_bad_options_are_one_line_errors_with_exit_2(args: tuple[str, ...], said: str) -> None:
    router = ("--router", "http://127.0.0.1:9") if "--router" not in args else ()
    done = corral_load(*router, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    # the refusal is the contract: one line naming the value and what to do
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert done.stdout == ""


def test_an_unreachable_router_is_a_one_line_error_with_exit_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = corral_load("--router", url, "--seconds", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    # the refusal is the contract: one line naming the value and what to do
    assert done.stderr.startswith(f"Error: cannot reach the router at {url}"), done.stderr
    assert done.stderr.count("\n") == 1 and "--router" in done.stderr


def test_a_model_the_router_does_not_serve_is_refused_before_any_load() -> None:
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url)
    try:
        done = corral_load("--router", url, "--model", "no-such-model", "--seconds", "1")
        assert done.returncode == 2, done.stdout + done.stderr
        # the refusal is the contract: one line naming the value and what to do
        assert "--model 'no-such-model' is not served" in done.stderr and "sim-model" in done.stderr
        assert finished_on(sim_url) == 0
    finally:
        router.stop()
        sim.stop()


@pytest.mark.parametrize(
    ("mode", "share", "kind"),
    [
        ("not-json", "0", "bad answer (not JSON)"),
        ("not-json", "1", "stream cut"),
        ("cut", "0", "answer cut"),
        ("cut", "1", "stream cut"),
        ("close", "0", "connection closed"),
        ("close", "1", "connection closed"),
        ("long-line", "1", "stream cut"),  # a 3 MiB event line, read in constant memory, then no [DONE]
        ("huge", "1", "stream cut"),  # a 70 MiB JSON answer to a streamed request
    ],
)
def test_every_broken_answer_is_counted_as_a_failure_of_its_kind(mode: str, share: str, kind: str) -> None:
    engine, url = hostile_engine.start(mode)  # speaks OpenAI on loopback, as a router would
    try:
        done = corral_load("--router", url, "--rate", "10", "--seconds", "1", "--stream-share", share)
    finally:
        hostile_engine.stop(engine)
    assert done.returncode == 1, done.stdout + done.stderr
    # the printed answer is the contract: what the person who ran the command reads
    found = SUMMARY.search(done.stdout)
    assert found is not None, done.stdout
    assert found[3] == "0" and found[4] == found[2] and found[5] == f"{kind} ×{found[2]}", found[0]


async def test_a_router_that_never_answers_holds_at_most_the_ceiling_in_flight() -> None:
    """At 2,000 req/s against a server that holds every POST unanswered, the load stops starting
    requests at MAX_IN_FLIGHT instead of opening a connection for each one due; each ends a timeout."""
    held: list[int] = [0, 0]  # now, most at once
    release = asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        held[0] += 1
        held[1] = max(held)
        try:
            await release.wait()
        finally:
            held[0] -= 1
        return web.Response(status=503)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", hold)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    plan = LoadPlan(
        url=f"http://127.0.0.1:{port}/v1/chat/completions",
        model="m",
        seconds=1.0,
        max_requests=5_000,
        stream_share=0.5,
        rate=2_000.0,
        request_timeout=3.0,
    )
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            tally, _ = await run_load(plan, session, asyncio.Event(), lambda *_: None)
    finally:
        release.set()
        await runner.cleanup()
    assert tally.sent == MAX_IN_FLIGHT and held[1] <= MAX_IN_FLIGHT
    assert tally.failures == Counter({"timeout": MAX_IN_FLIGHT})


def test_a_router_with_tenants_takes_the_key_file_and_refuses_the_load_without_it(tmp_path: Path) -> None:
    key = "tenant-load-key-0123456789"
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"- name: demo\n  key: {key}\n")
    keys.chmod(0o600)
    key_file = tmp_path / "demo.key"
    key_file.write_text(key + "\n")
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-a-tenant-key-000000\n")
    sim, sim_url = start_sim(None, *SIM_ARGS)
    router, url = start_router(sim_url, extra=("--api-keys-file", str(keys)))
    try:
        for refused, said in (
            ((), "wants an API key (401): pass --api-key-file FILE"),
            (("--api-key-file", str(wrong)), "refused the key in --api-key-file (401)"),
        ):
            done = corral_load("--router", url, "--seconds", "1", *refused)
            assert done.returncode == 2, done.stdout + done.stderr
            # the refusal is the contract: one line saying what to do, never the key
            assert said in done.stderr and done.stderr.count("\n") == 1, done.stderr
            assert key not in done.stderr + done.stdout
        served = corral_load(
            "--router", url, "--rate", "20", "--seconds", "1", "--api-key-file", str(key_file)
        )
        assert served.returncode == 0, served.stdout + served.stderr
        found = SUMMARY.search(served.stdout)
        assert found is not None and found[4] == "0" and int(found[3]) > 0, served.stdout
        assert key not in served.stdout + served.stderr
    finally:
        router.stop()
        sim.stop()
