"""A drain's wait for a disaggregated engine's KV transfers (lifecycle/drain_transfers.py) against a real
HTTP /metrics endpoint: held transfers pulled or expired, a bound by the lease or the drain's deadline,
a decode engine's pulls, what a real vLLM does not show named as not measured (never as 0), the drain
sequence's extra step for a P/D engine only, and the change record's step."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.engine.metric_names import (
    FINISHED,
    KV_FETCH_BY_STAGE,
    NIXL_KV_EXPIRED_REQS,
    RUNNING,
    SIM_KV_PULLS_IN_FLIGHT,
    SIM_KV_TRANSFERS_HELD,
    WAITING,
)
from corral.engine_state import EngineState
from corral.supervisor.lifecycle.drain import DrainPolicy, DrainSequence, DrainSettings
from corral.supervisor.lifecycle.drain_record import _transfers_step
from corral.supervisor.lifecycle.drain_transfers import (
    NOT_MEASURED,
    TransferSide,
    read_transfers,
    wait_transfers,
)
from tests.unit.test_supervisor_drain_sequence import Host

PREFILL = TransferSide(role="prefill", lease_seconds=30.0)
DECODE = TransferSide(role="decode", lease_seconds=30.0)


class Engine:
    """Answers /metrics from `lines` (mutable); `script` changes them after a number of reads."""

    def __init__(self) -> None:
        self.lines: dict[str, str] = {}
        self.reads = 0
        self.script: dict[int, dict[str, str]] = {}

    async def metrics(self, request: web.Request) -> web.Response:
        self.reads += 1
        self.lines.update(self.script.pop(self.reads, {}))
        base = f"{RUNNING} 0\n{WAITING} 0\n{FINISHED} 3\n"
        return web.Response(text=base + "".join(f"{k} {v}\n" for k, v in self.lines.items()))


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, aiohttp.ClientSession, str]]:
    e = Engine()
    app = web.Application()
    app.router.add_get("/metrics", e.metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield e, session, str(server.make_url("")).rstrip("/")
    await server.close()


async def wait(
    rig: tuple[Engine, aiohttp.ClientSession, str],
    side: TransferSide,
    within: float = 60.0,
    transfer_wait: float = 0.0,
) -> dict[str, Any]:
    _, session, url = rig
    deadline = time.monotonic() + within
    report = await wait_transfers(session, url, side, deadline, transfer_wait, 0.01, lambda line: None)
    return report.to_json()


def test_the_side_comes_from_the_engine_command() -> None:
    assert TransferSide.of_command(["vllm", "serve", "m"]) is None  # aggregated: nothing to wait for
    producer = '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'
    assert TransferSide.of_command(["vllm", "serve", "m", "--kv-transfer-config", producer]) == PREFILL
    consumer = (
        '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer", '
        '"kv_connector_extra_config": {"kv_lease_duration": 4}}'
    )
    side = TransferSide.of_command(["vllm", "serve", "m", f"--kv-transfer-config={consumer}"])
    assert side == TransferSide(role="decode", lease_seconds=4.0) and side.pulls and not side.holds
    assert TransferSide.of_command(["vllm", "--kv-transfer-config", "{not json"]) is None


def test_reading_the_figures_sums_labels_and_keeps_absent_ones_absent() -> None:
    text = (
        f'{SIM_KV_TRANSFERS_HELD}{{engine="0"}} 2\n{SIM_KV_TRANSFERS_HELD}{{engine="1"}} 1\n'
        f"{NIXL_KV_EXPIRED_REQS} 4\n"
    )
    figures = read_transfers(text)
    assert (figures.held, figures.pulls, figures.expired) == (3.0, None, 4.0)
    # a real vLLM decode engine: only the stages before the pull finished count as pulls
    stages = "".join(
        f'{KV_FETCH_BY_STAGE}{{engine="0",stage="{stage}"}} {n}\n'
        for stage, n in (("waiting_to_start", 1), ("in_progress", 2), ("completed_waiting", 5))
    )
    figures = read_transfers(stages)
    assert (figures.held, figures.pulls, figures.expired) == (None, 3.0, None)
    with pytest.raises(ValueError):
        read_transfers("not prometheus {")


async def test_held_transfers_pulled_and_expired_are_told_apart(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    e = engine[0]
    e.lines = {SIM_KV_TRANSFERS_HELD: "2", NIXL_KV_EXPIRED_REQS: "5"}
    e.script = {3: {SIM_KV_TRANSFERS_HELD: "1"}, 6: {SIM_KV_TRANSFERS_HELD: "0", NIXL_KV_EXPIRED_REQS: "6"}}
    report = await wait(engine, PREFILL)
    assert report["ended"] == "clear" and report["bound"] == "lease"
    assert (report["held_at_start"], report["pulled"], report["timed_out"], report["held_at_end"]) == (
        2,
        1,
        1,
        0,
    )
    assert report["source"]["held"] == SIM_KV_TRANSFERS_HELD
    assert report["source"]["timed_out"] == NIXL_KV_EXPIRED_REQS
    assert report["not_measured"] == []


async def test_a_transfer_nobody_pulls_is_waited_for_until_the_lease_then_reported(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    engine[0].lines = {SIM_KV_TRANSFERS_HELD: "1", NIXL_KV_EXPIRED_REQS: "0"}
    report = await wait(engine, TransferSide(role="prefill", lease_seconds=0.2))
    assert report["ended"] == "bound" and report["bound"] == "lease"
    assert report["held_at_end"] == 1 and report["pulled"] == 0 and report["timed_out"] == 0
    name, _, ok, data = _transfers_step(report)[0]
    assert name == "wait_transfers" and not ok and data is report


async def test_the_drain_deadline_bounds_the_wait_when_it_comes_before_the_lease(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    engine[0].lines = {SIM_KV_TRANSFERS_HELD: "1"}
    report = await wait(engine, PREFILL, within=0.2)
    assert report["ended"] == "bound" and report["bound"] == "drain_deadline"
    assert report["timed_out"] is None  # no expiry counter shown: not measured, not 0
    assert any(line.startswith("timed_out:") for line in report["not_measured"])


async def test_a_decode_engine_waits_for_its_pulls(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    e = engine[0]
    e.lines = {SIM_KV_PULLS_IN_FLIGHT: "2"}
    e.script = {4: {SIM_KV_PULLS_IN_FLIGHT: "0"}}
    report = await wait(engine, DECODE)
    assert report["ended"] == "clear" and e.reads >= 4
    assert (report["pulls_at_start"], report["pulls_at_end"]) == (2, 0)
    assert report["held_at_start"] is None and report["source"]["held"] == "not_applicable"


async def test_a_real_vllm_prefill_engine_is_not_measured_and_waited_for_only_if_asked(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    e = engine[0]
    report = await wait(engine, PREFILL)
    assert report["ended"] == NOT_MEASURED and report["held_at_start"] is None
    assert report["source"]["held"] == NOT_MEASURED and report["pulled"] is None
    assert any(line.startswith("held:") for line in report["not_measured"])
    reads = e.reads
    asked = await wait(engine, PREFILL, transfer_wait=0.2)
    assert asked["ended"] == "transfer_wait_passed" and asked["bound"] == "drain_transfer_wait"
    assert e.reads > reads + 1  # it kept reading for the wait it was asked for


async def test_the_drain_sequence_waits_for_transfers_of_a_pd_engine_only(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    e, session, url = engine
    e.lines = {SIM_KV_TRANSFERS_HELD: "1", NIXL_KV_EXPIRED_REQS: "0"}
    e.script = {12: {SIM_KV_TRANSFERS_HELD: "0"}}
    h = Host(session, url, EngineState.READY)
    h.drain_settings = DrainSettings(
        propagation_timeout=2.0, quiet_period=0.05, poll_seconds=0.01, transfers=PREFILL
    )
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.WAIT)
    subs = [sub for _, sub in h.steps()]
    assert subs == [
        "leaving_routing",
        "waiting_in_flight",
        "waiting_transfers",
        "stopping_engine",
        "engine_stopped",
    ]
    assert report.transfers is not None and report.transfers["pulled"] == 1
    assert report.transfers["ended"] == "clear"
    assert h.stops and e.lines[SIM_KV_TRANSFERS_HELD] == "0"  # stopped only once nothing was held


async def test_policy_abort_does_not_wait_but_says_so(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    e, session, url = engine
    e.lines = {SIM_KV_TRANSFERS_HELD: "1"}
    h = Host(session, url, EngineState.READY)
    h.drain_settings = DrainSettings(
        propagation_timeout=2.0, quiet_period=0.05, poll_seconds=0.01, transfers=PREFILL
    )
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.ABORT)
    assert "waiting_transfers" not in [sub for _, sub in h.steps()]
    assert report.transfers is not None and report.transfers["ended"] == "skipped: policy abort"


async def test_an_aggregated_engine_has_no_transfers_in_its_report(
    engine: tuple[Engine, aiohttp.ClientSession, str],
) -> None:
    _, session, url = engine
    h = Host(session, url, EngineState.READY)
    report = await DrainSequence(h, lambda line: None).drain_and_stop(DrainPolicy.WAIT)
    assert report.transfers is None and _transfers_step(report.transfers) == []
