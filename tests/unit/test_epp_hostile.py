"""What a gateway (or whoever reaches the ext_proc port) may send the endpoint picker, at its worst: huge,
malformed and hostile bodies, headers and subset hints. Each is refused with a clear ImmediateResponse or
read within its bound (docs/security.md, "Endpoint picker"), and the picker goes on picking. The exchanges
run through the real `Exchange` over a real (unstarted) core: one READY endpoint put in its membership."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf import struct_pb2

from corral.engine_state import EngineState
from corral.epp import wire
from corral.epp.decision import Picker
from corral.epp.exchange import Exchange
from corral.router.app import RouterConfig
from corral.router.core import RouterCore
from corral.router.membership.endpoint import Endpoint

ENGINE = "http://10.0.0.7:8000"
BODY = orjson.dumps({"model": "m", "prompt": "hello"})


def core() -> RouterCore:
    built = RouterCore(RouterConfig(backends=(ENGINE,)))
    endpoint = built.membership.add(Endpoint(ENGINE, reason="test"), "test")
    built.membership.update(ENGINE, "ready", state=EngineState.READY, models=frozenset({"m"}))
    assert endpoint.in_routing
    return built


def headers_message(pairs: Iterable[tuple[str, bytes]], subset: Any = None) -> ext_proc.ProcessingRequest:
    message = ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in pairs])
        )
    )
    if subset is not None:
        inner = struct_pb2.Struct()
        inner.update({wire.SUBSET_KEY: subset})
        message.metadata_context.filter_metadata[wire.SUBSET_NAMESPACE].CopyFrom(inner)
    return message


def body_message(body: bytes, end: bool = True) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=body, end_of_stream=end))


async def run(
    *messages: ext_proc.ProcessingRequest, max_body: int = 1 << 20
) -> list[ext_proc.ProcessingResponse]:
    built = core()

    async def sent() -> AsyncIterator[ext_proc.ProcessingRequest]:
        for message in messages:
            yield message

    exchange = Exchange(Picker(built), built.metrics, max_body)
    answers = [answer async for answer in exchange.run(sent())]
    assert built.membership.get(ENGINE).in_flight == 0  # nothing is left counted, however it ended
    return answers


PATH = [(":path", b"/v1/completions")]


def refused(answers: list[ext_proc.ProcessingResponse]) -> tuple[int, str]:
    assert len(answers) == 1 and answers[0].HasField("immediate_response"), answers
    immediate = answers[0].immediate_response
    return immediate.status.code, orjson.loads(immediate.body)["error"]["message"]


async def test_a_good_request_is_picked() -> None:
    answers = await run(headers_message(PATH), body_message(BODY))
    assert answers[0].request_headers.response.clear_route_cache
    lb = answers[0].dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == "10.0.0.7:8000"
    assert b"".join(a.request_body.response.body_mutation.streamed_response.body for a in answers[1:]) == BODY


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"model": 12}', 400, "`model` must be a string"),
        (b'{"model": "elsewhere"}', 404, "does not exist"),
        (b"{" * 100_000, 400, "not valid JSON"),  # nesting far past any parser's depth
    ],
)
async def test_malformed_bodies_are_refused_with_the_reason(body: bytes, status: int, says: str) -> None:
    code, message = refused(await run(headers_message(PATH), body_message(body)))
    assert code == status and says in message


async def test_a_body_over_the_bound_is_refused_413_as_it_arrives() -> None:
    chunk = b"x" * 600_000
    code, message = refused(
        await run(
            headers_message(PATH), body_message(chunk, end=False), body_message(chunk), max_body=1 << 20
        )
    )
    assert code == 413 and "1048576 bytes" in message


async def test_too_many_or_too_large_headers_or_bad_bytes_are_refused() -> None:
    many = [(f"x-h{i}", b"v") for i in range(wire.MAX_HEADERS + 1)]
    assert refused(await run(headers_message(many), body_message(BODY)))[0] == 400
    huge = [("x-big", b"v" * (wire.MAX_HEADER_BYTES + 1))]
    assert refused(await run(headers_message(huge), body_message(BODY)))[0] == 400
    code, message = refused(await run(headers_message([*PATH, ("x-bin", b"\xff\xfe")]), body_message(BODY)))
    assert code == 400 and "not UTF-8" in message


@pytest.mark.parametrize(
    "subset",
    [
        12,  # a number
        [1, 2],  # not strings
        {"a": "b"},  # a struct
        ["10.0.0.7:8000"] * (wire.MAX_SUBSET_ENTRIES + 1),
        ",".join(f"10.1.{i // 256}.{i % 256}:8000" for i in range(wire.MAX_SUBSET_ENTRIES + 1)),
    ],
    ids=["number", "numbers", "struct", "long-list", "long-string"],
)
async def test_bad_subset_hints_are_refused(subset: Any) -> None:
    code, message = refused(await run(headers_message(PATH, subset), body_message(BODY)))
    assert code == 400 and wire.SUBSET_KEY in message


async def test_subset_entries_that_name_no_endpoint_match_nothing() -> None:
    for subset in (["x" * 10_000], [""], ["10.0.0.7"], ["10.0.0.7:8000x"]):
        code, _ = refused(await run(headers_message(PATH, subset), body_message(BODY)))
        assert code == 503, subset


async def test_hostile_response_phases_are_read_within_bounds() -> None:
    garbage = ext_proc.ProcessingRequest(
        response_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=":status", raw_value=b"9" * 5000)]
                + [base_pb2.HeaderValue(key=f"h{i}", raw_value=b"v") for i in range(wire.MAX_HEADERS + 5)]
            )
        )
    )
    served = ext_proc.ProcessingRequest(
        response_body=ext_proc.HttpBody(body=b"x" * 100_000, end_of_stream=True)
    )
    answers = await run(headers_message(PATH), body_message(BODY), garbage, served)
    handed = b"".join(a.response_body.response.body_mutation.streamed_response.body for a in answers)
    assert handed == b"x" * 100_000  # the response body goes on whole, in chunks under the bound
    assert all(len(a.SerializeToString()) < 64 * 1024 for a in answers)
