"""The response phases as the endpoints count them: the endpoint the gateway says served (after the primary
failed) takes the request, the primary counts a failed attempt; a 5xx answer is an error of the endpoint
that served it; nothing stays in flight either way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf import struct_pb2

from corral.epp import wire
from corral.epp.decision import Picker
from corral.epp.exchange import Exchange
from corral.router.core import RouterCore
from corral.router.membership.endpoint import Endpoint
from tests.support.epp_fleet import MODEL, engine_url, messages, ready_core


async def exchange(core: RouterCore, status: int, served: Callable[[str], str | None]) -> str:
    """One exchange; the gateway reports `served(primary)` as the endpoint that served (None: none)."""
    sent = messages({"model": MODEL, "prompt": "hello"}, status=status)
    primary: list[str] = []

    async def gateway() -> AsyncIterator[ext_proc.ProcessingRequest]:
        for i, message in enumerate(sent):
            report = served(primary[0]) if i == 2 and primary else None
            if report is not None:  # the response headers name the endpoint that served
                inner = struct_pb2.Struct()
                inner.update({wire.SERVED_KEY: report})
                message.metadata_context.filter_metadata[wire.DESTINATION_NAMESPACE].CopyFrom(inner)
            yield message

    async for answer in Exchange(Picker(core), core.metrics, 1 << 20).run(gateway()):
        if answer.HasField("dynamic_metadata"):
            lb = answer.dynamic_metadata.fields[wire.DESTINATION_NAMESPACE].struct_value
            primary.append(lb.fields[wire.DESTINATION_KEY].string_value.split(",")[0])
    return primary[0]


def endpoint(core: RouterCore, address: str) -> Endpoint:
    found = core.membership.get(f"http://{address}")
    assert found is not None
    return found


async def test_the_served_endpoint_takes_the_request_and_the_primary_counts_a_failure() -> None:
    core = ready_core(2)
    addresses = [engine_url(i).removeprefix("http://") for i in range(2)]
    fallback: list[str] = []

    def the_other(primary: str) -> str:
        fallback.append(next(a for a in addresses if a != primary))
        return fallback[0]

    primary = await exchange(core, 200, the_other)  # the primary failed; the gateway fell back
    assert endpoint(core, primary).traffic.errors == 1
    assert endpoint(core, primary).traffic.requests == 1
    served = endpoint(core, fallback[0])
    assert served.traffic.requests == 1 and served.traffic.errors == 0
    assert served.requests_sent == 1 and served.traffic.warmup_ttft_s is not None  # its first token
    assert all(endpoint(core, a).in_flight == 0 and endpoint(core, a).dispatching == 0 for a in addresses)


async def test_a_5xx_answer_is_an_error_of_the_endpoint_that_served_it() -> None:
    core = ready_core(1)
    address = await exchange(core, 503, lambda primary: None)
    served = endpoint(core, address)
    assert served.traffic.requests == 1 and served.traffic.errors == 1 and served.in_flight == 0
    assert core.metrics.errors == 1


async def test_a_served_endpoint_the_picker_does_not_know_changes_nothing() -> None:
    core = ready_core(1)
    address = await exchange(core, 200, lambda primary: "10.99.99.99:1")
    served = endpoint(core, address)
    assert served.traffic.requests == 1 and served.traffic.errors == 0
