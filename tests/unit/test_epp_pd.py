"""A prefill/decode model through the endpoint picker: the gateway is sent to a decode engine, told the
prefill engine in `x-prefiller-host-port` (as llm-d's routing sidecar reads it), both engines of the pair
compatible; the prefill engine counts the request until the decode engine answers; no compatible pair: 503."""

from __future__ import annotations

from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from corral.engine_state import EngineState
from corral.epp import wire
from corral.epp.decision import Picker
from corral.epp.exchange import Exchange
from corral.router.app import RouterConfig
from corral.router.core import RouterCore
from corral.router.membership.endpoint import Endpoint
from tests.support.epp_fleet import MODEL, messages

PREFILL = ("http://10.0.1.1:8000", "http://10.0.1.2:8000")
DECODE = ("http://10.0.2.1:8000", "http://10.0.2.2:8000")


def pd_core(decode_pairing: str = "nixl-a") -> RouterCore:
    core = RouterCore(RouterConfig(backends=PREFILL + DECODE))
    for urls, role, pairing in ((PREFILL, "prefill", "nixl-a"), (DECODE, "decode", decode_pairing)):
        for url in urls:
            core.membership.add(Endpoint(url, reason="test", role=role), "test")
            core.membership.update(
                url, "ready", state=EngineState.READY, models=frozenset({MODEL}), pairing=pairing
            )
    return core


async def run(core: RouterCore, sent: list[ext_proc.ProcessingRequest]) -> list[ext_proc.ProcessingResponse]:
    async def gateway() -> AsyncIterator[ext_proc.ProcessingRequest]:
        for message in sent:
            yield message

    return [answer async for answer in Exchange(Picker(core), core.metrics, 1 << 20).run(gateway())]


async def test_the_pair_goes_to_the_gateway_as_llm_d_passes_it() -> None:
    core = pd_core()
    sent = messages({"model": MODEL, "prompt": "a prompt to prefill", "max_tokens": 4})
    picked = (await run(core, sent[:2]))[0]  # the exchange left open after the pick
    headers = {
        h.header.key: h.header.raw_value.decode()
        for h in picked.request_headers.response.header_mutation.set_headers
    }
    decode = headers[wire.DESTINATION_KEY].split(",")
    assert {f"http://{d}" for d in decode} <= set(DECODE)
    assert f"http://{headers[wire.PREFILL_HEADER]}" in PREFILL
    # the exchange ended without an answer (a client that left): nothing stays counted on either engine
    assert all(core.membership.get(url).in_flight == 0 for url in PREFILL + DECODE)  # type: ignore[union-attr]


async def test_the_prefill_engine_counts_the_request_until_the_decode_engine_answers() -> None:
    core = pd_core()
    sent = messages({"model": MODEL, "prompt": "another prompt", "max_tokens": 4})
    seen: list[int] = []

    async def gateway() -> AsyncIterator[ext_proc.ProcessingRequest]:
        for i, message in enumerate(sent):
            if i == 2:  # before the decode engine's response headers
                seen.append(sum(core.membership.get(u).dispatching for u in PREFILL))  # type: ignore[union-attr]
            yield message

    async for _ in Exchange(Picker(core), core.metrics, 1 << 20).run(gateway()):
        pass
    assert seen == [1]
    assert sum(core.membership.get(u).in_flight for u in PREFILL + DECODE) == 0  # type: ignore[union-attr]


async def test_no_compatible_decode_engine_is_a_503() -> None:
    answers = await run(
        pd_core(decode_pairing="other-connector"), messages({"model": MODEL, "prompt": "x"})[:2]
    )
    assert answers[0].immediate_response.status.code == 503
