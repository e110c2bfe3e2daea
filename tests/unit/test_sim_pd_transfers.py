"""The simulated KV connector's bookkeeping: held blocks pinned in the scheduler until pulled or expired,
pulls that fail, hang or meet unknown blocks, and what a decode engine does about a failed load."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.sim.core.kv_transfer import KvLoadFailed, KvTransfers, PullAnswer
from corral.sim.core.requests import RequestError
from corral.sim.core.scheduler import EngineRequest, Scheduler
from corral.sim.http.protocol import parse_chat, parse_completion
from tests.support.waits import eventually


def config(role: str = "kv_both", lease: float = 30.0, **more: Any) -> dict[str, Any]:
    return {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"kv_lease_duration": lease},
        **more,
    }


def connector(role: str = "kv_both", lease: float = 30.0, **kw: Any) -> KvTransfers:
    sched = Scheduler(max_num_seqs=4, total_blocks=100, block_size=16)
    kv = KvTransfers(config(role, lease), "engine-p", sched, bytes_per_block=1000, ms_per_block=0.0, **kw)
    kv.side_channel = ("127.0.0.1", 9000)
    return kv


def wire(decode: KvTransfers, prefill: KvTransfers) -> None:
    async def fetch(host: str, port: int, request_id: str, blocks: int, timeout_s: int) -> PullAnswer:
        assert (host, port) == prefill.side_channel
        return await prefill.serve_pull(request_id, blocks)

    decode.fetch = fetch


async def test_hold_pins_prompt_blocks_and_answers_vllm_params() -> None:
    kv = connector("kv_producer")
    params = kv.hold("req", prompt_len=33, tp_size=2)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == "engine-p"
    assert (params["remote_host"], params["remote_port"], params["tp_size"]) == ("127.0.0.1", 9000, 2)
    assert len(params["remote_block_ids"]) == 1 and len(params["remote_block_ids"][0]) == 3  # ceil(33/16)
    assert params["remote_request_id"].startswith("req-")
    assert kv.scheduler.reserved_blocks == 3 and len(kv.held) == 1
    again = kv.hold("req", prompt_len=16, tp_size=1)  # a repeated client id is another transfer
    assert again["remote_request_id"] != params["remote_request_id"] and len(kv.held) == 2


async def test_a_pull_frees_the_blocks_once() -> None:
    prefill, decode = connector("kv_producer"), connector("kv_consumer")
    wire(decode, prefill)
    params = prefill.hold("req", prompt_len=40, tp_size=1)
    assert await decode.pull(params, 40) is True  # 3 blocks wanted (ceil(40/16))
    assert prefill.held == {} and prefill.scheduler.reserved_blocks == 0
    assert decode.stats.xfer_time.count == 1 and decode.stats.bytes_transferred.sum == 3 * 1000
    with pytest.raises(KvLoadFailed, match="unknown"):  # the blocks are gone: a second pull fails
        await decode.pull(params, 40)
    assert decode.stats.failed_transfers == 1 and decode.pulls_in_flight == 0


async def test_lease_expiry_frees_and_counts_and_a_late_pull_is_told() -> None:
    prefill, decode = connector("kv_producer", lease=0.05), connector("kv_consumer")
    wire(decode, prefill)
    params = prefill.hold("req", prompt_len=20, tp_size=1)
    await eventually(lambda: prefill.stats.expired == 1, "the lease expired")
    assert prefill.held == {} and prefill.scheduler.reserved_blocks == 0 and prefill.stats.expired == 1
    with pytest.raises(KvLoadFailed, match="expired"):
        await decode.pull(params, 40)
    assert prefill.stats.notifications_after_expiry == 1


async def test_failed_pull_leaves_blocks_stranded_until_the_lease() -> None:
    prefill, decode = connector("kv_producer", fail_rate=1.0), connector("kv_consumer")
    wire(decode, prefill)
    params = prefill.hold("req", prompt_len=20, tp_size=1)
    with pytest.raises(KvLoadFailed, match="failed"):
        await decode.pull(params, 40)
    assert len(prefill.held) == 1 and decode.stats.failed_transfers == 1


async def test_hung_pull_stays_in_flight_until_the_lease_ends() -> None:
    # a lease long against the one loop turn between the pull's start and the check below
    prefill, decode = connector("kv_producer", lease=1.0, hang=True), connector("kv_consumer")
    wire(decode, prefill)
    params = prefill.hold("req", prompt_len=20, tp_size=1)
    pull = asyncio.create_task(decode.pull(params, 20))
    await eventually(lambda: decode.pulls_in_flight == 1, "the pull in flight")
    assert len(prefill.held) == 1
    with pytest.raises(KvLoadFailed, match="expired"):
        await pull
    assert decode.pulls_in_flight == 0 and prefill.held == {} and prefill.stats.expired == 1


async def test_recompute_policy_returns_false_instead_of_failing() -> None:
    decode = KvTransfers(
        config("kv_consumer", kv_load_failure_policy="recompute"),
        "engine-d",
        Scheduler(4, 100, 16),
        bytes_per_block=1,
        ms_per_block=0.0,
    )

    async def unreachable(host: str, port: int, request_id: str, blocks: int, timeout_s: int) -> PullAnswer:
        return PullAnswer("unreachable")

    decode.fetch = unreachable
    params = {"remote_host": "127.0.0.1", "remote_port": 1, "remote_request_id": "x"}
    assert await decode.pull(params, 40) is False
    assert decode.stats.failed_transfers == 1


async def test_held_blocks_keep_waiting_requests_out_until_freed() -> None:
    kv = connector("kv_producer")
    sched = kv.scheduler
    kv.hold("big", prompt_len=16 * 90, tp_size=1)  # 90 of 100 blocks held
    waiting = asyncio.create_task(sched.admit(EngineRequest("r", 16 * 20, 1, 0.0)))
    await eventually(lambda: sched.num_waiting == 1, "the request queued")
    assert not waiting.done()
    kv.abort_all()
    assert await waiting is True
    assert sched.reserved_blocks == sched.blocks_for(next(iter(sched.running)))


async def test_a_pull_moves_only_the_blocks_the_decode_engine_lacks() -> None:
    prefill, decode = connector("kv_producer"), connector("kv_consumer")
    wire(decode, prefill)
    params = prefill.hold("req", prompt_len=160, tp_size=1)  # 10 blocks held
    assert await decode.pull(params, 32) is True  # its prefix cache had all but 2 blocks
    assert decode.stats.bytes_transferred.sum == 2 * 1000
    assert prefill.held == {} and prefill.scheduler.reserved_blocks == 0  # all are freed


def test_roles() -> None:
    sched = Scheduler(4, 100, 16)
    p = KvTransfers(config("kv_producer"), "e", sched, 1, 0.0)
    d = KvTransfers(config("kv_consumer"), "e", sched, 1, 0.0)
    b = KvTransfers(config("kv_both"), "e", sched, 1, 0.0)
    assert (p.produces, p.consumes, d.produces, d.consumes, b.produces, b.consumes) == (
        True,
        False,
        False,
        True,
        True,
        True,
    )


def test_request_bodies_carry_kv_transfer_params() -> None:
    params = {"do_remote_decode": True}
    assert parse_completion({"prompt": "x", "kv_transfer_params": params}).kv_transfer_params == params
    chat = parse_chat({"messages": [{"role": "user", "content": "x"}], "kv_transfer_params": params})
    assert chat.kv_transfer_params == params
    assert parse_completion({"prompt": "x"}).kv_transfer_params is None
    with pytest.raises(RequestError) as err:
        parse_completion({"prompt": "x", "kv_transfer_params": [1]})
    assert err.value.status == 400 and "body.kv_transfer_params" in err.value.message
