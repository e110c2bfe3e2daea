"""`corral epp` as a gateway sees it: Envoy's side of ext_proc played with Envoy's own protos over real
gRPC (tests.support.envoy_side), the picker in front of three `corral sim` engines under `corral supervise`,
the picked requests sent over real HTTP to the engines and their answers fed back through the response
phases. One fleet for every check; the drain and the sleep come last, in one test, as they change it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.test_supervisor_support import Supervised, http_json, kill_leftovers, start_supervised
from tests.support.envoy_side import EnvoySide
from tests.support.procs import CorralProcess, free_port
from tests.support.sleep_load import DEV, run_op
from tests.support.waits import eventually, eventually_awaited, wait_until

ROUTER_ID = "epp-test"
MAIN_KEY = "sk-epp-main-0123456789"
SHED_KEY = "sk-epp-shed-0123456789"  # a tenant with max_in_flight 1: its second request at once is shed (429)
DRAIN_ARGS = ("--propagation-timeout", "10", "--quiet-period", "0.2", "--drain-timeout", "10")
COMPLETION = {"model": "sim-model", "prompt": "the gateway asks the picker", "max_tokens": 4}


@dataclass
class Fleet:
    sups: list[Supervised]
    epp: CorralProcess
    grpc: str
    http: str

    def address(self, sup: Supervised) -> str:
        return sup.engine_url.removeprefix("http://")

    def fleet(self) -> dict[str, Any]:
        return http_json(self.http + "/v1/fleet")[1]

    def endpoint(self, sup: Supervised) -> dict[str, Any]:
        return next(e for e in self.fleet()["endpoints"] if e["url"] == sup.engine_url)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    keys = tmp_path_factory.mktemp("epp") / "keys.yaml"
    keys.write_text(
        f"- {{name: main, key: {MAIN_KEY}}}\n- {{name: shed, key: {SHED_KEY}, max_in_flight: 1}}\n"
    )
    sups = [
        start_supervised(sim_args=("--seed", str(i), "--enable-sleep-mode"), sup_args=DRAIN_ARGS, env=DEV)
        for i in range(3)
    ]
    epp: CorralProcess | None = None
    try:
        for sup in sups:
            sup.wait_state("READY", 60)
        grpc_port, http_port = free_port(), free_port()
        epp = CorralProcess(
            [
                "epp",
                "--grpc-port",
                str(grpc_port),
                "--port",
                str(http_port),
                "--router-id",
                ROUTER_ID,
                "--supervisor-heartbeat",
                "0.5",
                "--policy",
                "round_robin",
                "--api-keys-file",
                str(keys),
                *(arg for sup in sups for arg in ("--supervised", f"{sup.engine_url}={sup.url}")),
            ]
        )
        http = f"http://127.0.0.1:{http_port}"
        epp.wait_http(http + "/health", timeout=60)
        fleet = Fleet(sups, epp, f"127.0.0.1:{grpc_port}", http)
        wait_until(
            lambda: (
                all(e["routable"] for e in fleet.fleet()["endpoints"])
                and all(ROUTER_ID in sup.state()["routers"]["subscribed"] for sup in sups)
            ),
            30,
            "every engine routable and every supervisor followed by the picker",
        )
        yield fleet
    finally:
        if epp is not None:
            epp.stop()
        for sup in sups:
            pids = sup.engine_pids()
            sup.proc.stop(grace=20)
            kill_leftovers(pids)


def auth(key: str = MAIN_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_health_services_answer(fleet: Fleet) -> None:
    side = EnvoySide(fleet.grpc)
    try:

        async def serving() -> bool:  # readiness follows membership, refreshed every 0.5 s
            return await side.status("readiness") == "SERVING"

        await eventually_awaited(serving, "readiness SERVING with three READY engines")
        for service in ("liveness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
            assert await side.status(service) == "SERVING", service
    finally:
        await side.close()


async def test_unary_and_streamed_requests_go_to_a_ready_engine_and_feed_its_counts(fleet: Fleet) -> None:
    side = EnvoySide(fleet.grpc)
    addresses = {fleet.address(sup): sup for sup in fleet.sups}
    try:
        async with aiohttp.ClientSession() as session:
            for stream in (False, True):
                exchange = side.exchange()
                answer = await exchange.picked({**COMPLETION, "stream": stream}, headers=auth())
                assert answer.endpoints[0] in addresses, answer
                assert answer.header == ",".join(answer.endpoints)  # header and metadata agree
                assert answer.removed == ["authorization"]  # the tenant's key stays at the gateway
                assert orjson.loads(answer.body)["stream"] is stream  # the body goes on unchanged
                picked = addresses[answer.endpoints[0]]
                # picked, not yet answered: in flight (and dispatching) on that endpoint
                during = fleet.endpoint(picked)
                assert during["in_flight"] == 1 and during["dispatching"] == 1, during
                before = during["traffic"]
                status, body = await exchange.forwarded(session)
                await exchange.close()
                assert status == 200
                assert (b"data: [DONE]" in body) is stream
                after = await _settled(fleet, picked)
                assert after["requests_sent"] == during["requests_sent"]
                assert after["traffic"]["requests"] == before["requests"] + 1
                assert _ttft_count(after["traffic"]) == _ttft_count(before) + 1, (before, after["traffic"])
    finally:
        await side.close()


async def test_the_subset_hint_is_honoured_and_an_empty_one_is_a_503(fleet: Fleet) -> None:
    side = EnvoySide(fleet.grpc)
    only = fleet.address(fleet.sups[1])
    try:
        for _ in range(4):  # round robin would move on: the hint holds it
            answer = await side.pick(COMPLETION, headers=auth(), subset=[only])
            assert answer.endpoints == [only]
        as_string = await side.pick(COMPLETION, headers=auth(), subset=f" {only} ,10.9.9.9:1")
        assert as_string.endpoints == [only]
        for subset in ([], ["10.9.9.9:8000"], "not an endpoint"):
            refused = await side.pick(COMPLETION, headers=auth(), subset=subset)
            assert refused.immediate_status == 503, (subset, refused)
            assert refused.immediate_headers.get("retry-after"), refused
            assert b"gateway's subset" in refused.immediate_body
        unknown = await side.pick({**COMPLETION, "model": "no-such-model"}, headers=auth())
        assert unknown.immediate_status == 404
    finally:
        await side.close()


async def test_the_fallback_list_is_ordered_least_in_flight_first(fleet: Fleet) -> None:
    side = EnvoySide(fleet.grpc)
    busy = fleet.address(fleet.sups[0])
    held = [side.exchange() for _ in range(2)]
    try:
        for exchange in held:  # two requests in flight on `busy`, as a gateway waiting on the engine
            assert (await exchange.picked(COMPLETION, headers=auth(), subset=[busy])).endpoints == [busy]
        everyone = {fleet.address(sup) for sup in fleet.sups}
        for _ in range(3):
            answer = await side.pick(COMPLETION, headers=auth())
            assert len(answer.endpoints) == 3 and set(answer.endpoints) == everyone, answer
            if answer.endpoints[0] != busy:
                assert answer.endpoints[-1] == busy, answer  # the busy one last among the fallbacks
    finally:
        for exchange in held:
            await exchange.close()
        await side.close()


async def test_a_tenant_over_its_cap_is_shed_with_429(fleet: Fleet) -> None:
    side = EnvoySide(fleet.grpc)
    first = side.exchange()
    try:
        assert (await first.picked(COMPLETION, headers=auth(SHED_KEY))).endpoints
        shed = await side.pick(COMPLETION, headers=auth(SHED_KEY))
        assert shed.immediate_status == 429, shed
        assert shed.immediate_headers.get("retry-after") == "1"
        assert (await side.pick(COMPLETION, headers=auth())).endpoints  # another tenant goes on
        missing = await side.pick(COMPLETION)
        assert missing.immediate_status == 401
    finally:
        await first.close()
    try:  # the stream's close gives the tenant's slot back

        async def slot_back() -> bool:
            return (await side.pick(COMPLETION, headers=auth(SHED_KEY))).immediate_status != 429

        await eventually_awaited(slot_back, "the shed tenant's slot back")
    finally:
        await side.close()


async def test_drain_and_sleep_wait_for_the_picker_and_nothing_is_picked_after_the_ack(fleet: Fleet) -> None:
    """Runs last: it drains engine 0 and sleeps engine 1."""
    side = EnvoySide(fleet.grpc)
    drained, sleeper, survivor = fleet.sups
    gone = fleet.address(drained)
    picks: list[tuple[float, str]] = []
    stop = asyncio.Event()

    async def keep_picking() -> None:
        while not stop.is_set():
            sent = time.time()
            answer = await side.pick(COMPLETION, headers=auth())
            if answer.endpoints:
                picks.append((sent, answer.endpoints[0]))

    held = side.exchange()
    try:
        # a request picked for the engine and not answered yet: the drain's acknowledgement counts it
        assert (await held.picked(COMPLETION, headers=auth(), subset=[gone])).endpoints == [gone]
        picking = asyncio.create_task(keep_picking())
        await eventually(lambda: any(a == gone for _, a in picks), "picks for the engine before the drain")
        status, _ = await asyncio.to_thread(http_json, drained.url + "/v1/drain", "POST", {})
        assert status == 202
        report = await asyncio.to_thread(
            drained.wait_for, "drained", lambda b: b.get("drain") is not None, 60
        )
        acks = [r for r in drained.oplog() if r["record"] == "ack" and r.get("router_id") == ROUTER_ID]
        assert acks, drained.oplog()
        ack = acks[0]
        assert ack["undispatched"] == 1, ack  # the picker's open request was waited for
        assert ROUTER_ID in {a["router_id"] for a in report["drain"]["routers_acknowledged"]}
        await eventually(lambda: any(at > ack["time"] for at, _ in picks), "picks after the acknowledgement")
        late = [(at, a) for at, a in picks if at > ack["time"] and a == gone]
        assert late == [], f"{len(late)} picks for the drained engine after the picker's acknowledgement"
        refused = await side.pick(COMPLETION, headers=auth(), subset=[gone])
        assert refused.immediate_status == 503

        # a sleep: acknowledged like a removal, then the engine is out of the picks until it wakes
        asleep = fleet.address(sleeper)
        await asyncio.to_thread(run_op, sleeper, "/v1/sleep", {"level": 1, "mode": "wait"})
        slept = [r for r in sleeper.oplog() if r["record"] == "ack" and r.get("router_id") == ROUTER_ID][-1][
            "time"
        ]
        mark = len(picks)
        await eventually(lambda: len(picks) > mark + 6, "picks while the engine sleeps")
        assert [a for at, a in picks[mark:] if at > slept and a == asleep] == []
        assert {a for at, a in picks[mark:] if at > slept} == {fleet.address(survivor)}
        nobody = await side.pick(COMPLETION, headers=auth(), subset=[gone, asleep])
        assert nobody.immediate_status == 503  # no endpoint can serve
        await asyncio.to_thread(run_op, sleeper, "/v1/wake", {})
        mark = len(picks)
        await eventually(lambda: asleep in {a for _, a in picks[mark:]}, "picks for the woken engine")
    finally:
        stop.set()
        await held.close()
        if "picking" in locals():
            await picking
        await side.close()


async def _settled(fleet: Fleet, sup: Supervised) -> dict[str, Any]:
    """The endpoint once the exchange's release has been counted (the stream closes asynchronously)."""
    found: dict[str, Any] = {}

    def idle() -> bool:
        found.update(fleet.endpoint(sup))
        return found["in_flight"] == 0

    await eventually(idle, "the request out of flight")
    return found


def _drain_reported(state: dict[str, Any]) -> bool:
    return state.get("drain") is not None


def _ttft_count(traffic: dict[str, Any]) -> int:
    """First tokens the endpoint's figures took: the warmup one, then the TTFT histogram's."""
    return sum(int(n) for n in traffic["ttft"]["counts"]) + (traffic["warmup_ttft_s"] is not None)
