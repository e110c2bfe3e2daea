"""A drain never strands a KV transfer: a supervised prefill `corral sim` holding two transfers (prefill
legs sent by hand, as a P/D proxy sends them) is drained through `POST /v1/drain`. A decode `corral sim`
pulls one during the drain; nobody pulls the other, so the drain waits until the engine's lease (shortened
with kv_lease_duration) expires it: the report says `pulled: 1, timed_out: 1`, and the engine is stopped
only after both."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp

from corral.engine.pd_protocol import decode_leg_body, prefill_leg_body, transfer_params_of
from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.procs import CorralProcess, free_port, start_sim

BODY = {"model": "sim-model", "prompt": "a prompt", "max_tokens": 4}
LEASE_S = 6  # long enough to pull one transfer during the drain, short for the other to expire
# the router's acknowledgement waits up to 5 s for decode legs: the propagation deadline must exceed it
ROUTED_DRAIN_ARGS = ("--propagation-timeout", "12", "--quiet-period", "0.3", "--drain-timeout", "30")
HUNG_LEASE_S = 8  # the hung pull's blocks expire after the router's acknowledgement gave up on it
DRAIN_ARGS = ("--propagation-timeout", "2", "--quiet-period", "0.3", "--drain-timeout", "30")


def kv_config(role: str, lease: float) -> str:
    return json.dumps(
        {
            "kv_connector": "NixlConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"kv_lease_duration": lease},
        }
    )


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def held(engine_url: str) -> float:
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("corral_sim_kv_transfers_held")
    )


def hold(prefill: Supervised, prompt: str) -> dict[str, Any]:
    """A prefill leg by hand: the engine answers with the params a decode engine needs, holding the blocks."""
    body = {**BODY, "prompt": prompt}
    params = transfer_params_of(post(prefill.engine_url + "/v1/completions", prefill_leg_body(body)))
    assert params is not None and params["do_remote_prefill"] is True
    return params


def test_a_drain_waits_for_one_transfer_pulled_and_one_expired_then_stops_the_engine() -> None:
    decode, decode_url = start_sim(None, "--kv-transfer-config", kv_config("kv_consumer", 30), wait=False)
    sim_args = ("--kv-transfer-config", kv_config("kv_producer", LEASE_S))
    try:
        with supervised(sim_args=sim_args, sup_args=DRAIN_ARGS) as prefill:
            decode.wait_http(decode_url + "/health")
            prefill.wait_state("READY", 60)
            pulled = hold(prefill, "the prompt whose blocks the decode engine pulls during the drain")
            hold(prefill, "the prompt whose blocks nobody pulls")
            assert held(prefill.engine_url) == 2
            status, _ = http_json(prefill.url + "/v1/drain", "POST", {})
            assert status in (200, 202), status
            prefill.wait_for("waiting for transfers", lambda b: b.get("sub_state") == "waiting_transfers", 20)
            answer = post(decode_url + "/v1/completions", decode_leg_body(BODY, pulled))
            assert answer["choices"][0]["text"], answer  # the decode engine pulled the blocks and went on
            pulled_at = time.time()

            body = prefill.wait_for("drained", lambda b: b.get("drain") is not None, 40)
            report = body["drain"]
            transfers = report["transfers"]
            assert transfers is not None, report
            assert transfers["role"] == "prefill" and transfers["bound"] == "lease"
            assert (transfers["held_at_start"], transfers["pulled"], transfers["timed_out"]) == (2, 1, 1), (
                transfers
            )
            assert transfers["held_at_end"] == 0 and transfers["ended"] == "clear"
            assert transfers["source"]["held"] == "corral_sim_kv_transfers_held"
            # the engine was stopped only after: after the pull, and after the expiry the wait saw
            transitions = prefill.transitions()
            subs = [t.get("sub_state") for t in transitions]
            assert subs.index("waiting_transfers") < subs.index("stopping_engine"), subs
            stopping = transitions[subs.index("stopping_engine")]
            assert stopping["time"] > pulled_at
            assert report["engine_exit_code"] is not None
            record = next(r for r in reversed(prefill.oplog()) if r["record"] == "change_record")
            (step,) = [s for s in record["steps"] if s["step"] == "wait_transfers"]
            assert step["ok"] and step["data"]["pulled"] == 1 and step["data"]["timed_out"] == 1
    finally:
        decode.stop()


async def test_a_router_acknowledges_a_prefill_removal_naming_the_decode_leg_it_could_not_confirm() -> None:
    """Through `corral router` (both engines supervised, their streams followed): a request whose pull
    hangs leaves the router's decode leg before its first byte; the router's acknowledgement of the
    prefill engine's removal waits for it, then says `transfers_unconfirmed: 1`, and the drain waits
    until the lease expires the transfer."""
    # the decode engine is supervised too: the router pairs engines by the identities their supervisors
    # publish (an unsupervised engine's is derived another way, and the two would not pair)
    decode_args = ("--kv-transfer-config", kv_config("kv_consumer", 30))
    prefill_args = ("--kv-transfer-config", kv_config("kv_producer", HUNG_LEASE_S), "--hang-kv-transfer")
    with (
        supervised(sim_args=decode_args) as decode,
        supervised(sim_args=prefill_args, sup_args=ROUTED_DRAIN_ARGS) as prefill,
    ):
        router, router_url = start_pd_router(prefill, decode)
        try:
            for sup in (decode, prefill):
                await asyncio.to_thread(sup.wait_state, "READY", 60)
            await asyncio.to_thread(router.wait_http, router_url + "/health")
            await wait_routable(router_url, prefill.engine_url)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                client = asyncio.create_task(post_async(session, router_url + "/v1/completions"))
                await until(lambda: held(prefill.engine_url) == 1, 20, "the prefill leg answered")
                status, _ = await asyncio.to_thread(http_json, prefill.url + "/v1/drain", "POST", {})
                assert status in (200, 202), status
                body = await asyncio.to_thread(
                    prefill.wait_for, "drained", lambda b: b.get("drain") is not None, 60
                )
                client.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await client
        finally:
            router.stop()
    report = body["drain"]
    (ack,) = report["routers_acknowledged"]
    assert ack["router_id"] == "router-pd" and ack["transfers_unconfirmed"] == 1, ack
    transfers = report["transfers"]
    assert transfers["routers_unconfirmed"] == 1
    assert (transfers["held_at_start"], transfers["pulled"], transfers["timed_out"]) == (1, 0, 1), transfers


def start_pd_router(prefill: Supervised, decode: Supervised) -> tuple[CorralProcess, str]:
    port = free_port()
    args = ["router", "--host", "127.0.0.1", "--port", str(port), "--router-id", "router-pd"]
    args += ["--supervisor-heartbeat", "0.5", "--prefill", prefill.engine_url, "--decode", decode.engine_url]
    for sup in (prefill, decode):
        args += ["--supervised", f"{sup.engine_url}={sup.url}"]
    return CorralProcess(args), f"http://127.0.0.1:{port}"


async def post_async(session: aiohttp.ClientSession, url: str) -> int:
    async with session.post(url, json=BODY) as resp:
        await resp.read()
        return resp.status


async def wait_routable(router_url: str, engine_url: str) -> None:
    def routable() -> bool:
        endpoints = http_json(router_url + "/v1/fleet")[1]["endpoints"]
        return any(e["url"] == engine_url and e["routable"] for e in endpoints)

    await until(routable, 30, f"{engine_url} routable")


async def until(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {within}s")
        await asyncio.sleep(0.1)
