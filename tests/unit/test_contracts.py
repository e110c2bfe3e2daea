"""The wire models read and write the bodies Corral's components exchanged before they existed: same
names, same values, unknown fields ignored, and the supervisor's messages for a bad body."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from corral.contracts.operations import (
    DrainRequest,
    OperationRecord,
    OperationStatus,
    SleepRequest,
    SwitchBundleRequest,
    WakeRequest,
)
from corral.contracts.router import RouterFleet
from corral.contracts.supervisor import (
    AckRecord,
    AckRequest,
    Heartbeat,
    NotJSON,
    OperationLine,
    StateLine,
    UnusableLine,
    decode_watch_line,
)
from corral.contracts.wire import first_message
from corral.engine_state import EngineState

STATE_LINE = {
    "type": "state",
    "epoch": 7,
    "from": "READY",
    "to": "DRAINING",
    "state": "DRAINING",
    "sub_state": "leaving_routing",
    "ready": False,
    "reason": "drain requested",
    "evidence": {"withdrawn_adapters": ["a", 3]},
    "time": 1764760000.123456,
    "since": 1764760000.123456,
    "fingerprint": "3f2a9c1d0e4b5a67",
    "bundle_name": "v2",
    "prefix_epoch": None,
    "role": "prefill",
    "pairing": "9c1d0e4b5a673f2a",
    "connector": "NixlConnector",
    "kv_events": "tcp://10.0.0.5:5557,tcp://10.0.0.5:5558",
    "operation": {"kind": "sleep", "id": "op-1", "detail": "level 1", "step": "drain_policy", "since": 1.5},
}


def test_a_state_line_is_written_as_it_was_read() -> None:
    line = StateLine.model_validate(STATE_LINE)
    assert line.state is EngineState.DRAINING and line.from_ is EngineState.READY
    assert line.encode() == orjson.dumps(STATE_LINE)


def test_a_state_line_from_a_newer_supervisor_is_read_leniently() -> None:
    raw = orjson.dumps({**STATE_LINE, "from": "HIBERNATING", "sub_state": 5, "new_field": 1})
    line = decode_watch_line(raw)
    assert isinstance(line, StateLine)
    assert line.from_ is None and line.sub_state is None and line.withdrawn_adapters == frozenset({"a"})


def test_watch_lines_of_each_kind() -> None:
    assert isinstance(decode_watch_line(b'{"type": "heartbeat", "epoch": 3, "time": 1.5}'), Heartbeat)
    assert decode_watch_line(b'{"type": "gossip"}') is None
    assert decode_watch_line(b"[1]") is None
    with pytest.raises(NotJSON):
        decode_watch_line(b"{nope")
    with pytest.raises(UnusableLine):
        decode_watch_line(b'{"type": "state", "epoch": 1, "state": "NAPPING"}')


def test_operation_lines_carry_the_runbook_step_and_an_old_or_odd_one_reads_as_none() -> None:
    line = decode_watch_line(
        b'{"type": "operation", "epoch": 4, "time": 2.0, "operation": '
        b'{"kind": "sleep", "id": null, "detail": "level 1", "step": "precheck", "since": 1.0}}'
    )
    assert isinstance(line, OperationLine) and line.operation is not None
    assert (line.operation.kind, line.operation.id, line.operation.step) == ("sleep", None, "precheck")
    ended = decode_watch_line(b'{"type": "operation", "epoch": 4, "time": 3.0, "operation": null}')
    assert isinstance(ended, OperationLine) and ended.operation is None
    odd = decode_watch_line(b'{"type": "operation", "operation": {"step": 3}}')
    assert isinstance(odd, OperationLine) and odd.operation is None
    old = {k: v for k, v in STATE_LINE.items() if k != "operation"}  # a supervisor before issue 18
    assert StateLine.model_validate(old).operation is None


def test_an_ack_keeps_its_field_order_and_values() -> None:
    body = {
        "router_id": "r1",
        "epoch": 9,
        "state": "DRAINING",
        "removal_latency_s": 0.002,
        "undispatched": 0,
        "transfers_unconfirmed": 0,
    }
    assert AckRequest.model_validate(body).encode() == orjson.dumps(body)
    record = {**body, "received": 2.0, "latency_s": None}
    assert AckRecord.model_validate(record).state is EngineState.DRAINING


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"epoch": 1}, "router_id must be a non-empty string of at most 200 characters"),
        ({"router_id": "r", "epoch": True}, "epoch must be a non-negative integer, not True"),
        ({"router_id": "r"}, "epoch must be a non-negative integer, not None"),
    ],
)
def test_a_bad_ack_says_what_the_supervisor_said(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AckRequest.model_validate(body)
    assert first_message(caught.value) == message


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (SleepRequest, {"level": "1"}, "level must be 0, 1 or 2, not '1'"),
        (SleepRequest, {"release_kv": 1}, "mode must be a string and release_kv a boolean"),
        (WakeRequest, {"tags": [1]}, "tags must be a list of strings, not [1]"),
        (SwitchBundleRequest, {}, "name must name a bundle declared on this host, not None"),
        (SwitchBundleRequest, {"name": "b", "ready_timeout": 0}, "ready_timeout must be above 0, not 0"),
        (DrainRequest, {"policy": None}, "policy None: use wait or abort"),
    ],
)
def test_a_bad_operation_body_says_what_the_supervisor_said(
    model: type[SleepRequest], body: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    assert first_message(caught.value) == message


def test_an_operation_request_sends_only_what_it_has() -> None:
    assert DrainRequest(operation_id="d-1").body() == {"operation_id": "d-1"}
    assert SleepRequest(level=2).body() == {"level": 2, "mode": "wait", "release_kv": False}


def test_an_operation_record_and_its_steps() -> None:
    body = {
        "operation_id": "sleep-1",
        "kind": "sleep",
        "status": "succeeded",
        "started": 1.0,
        "finished": 2.0,
        "result": {"steps": [{"step": "PRECHECK", "status": "done", "seconds": 0.01, "evidence": {}}]},
        "error": None,
    }
    record = OperationRecord.model_validate(body)
    assert record.status is OperationStatus.SUCCEEDED and record.done and record.succeeded
    assert [s.step for s in record.steps] == ["PRECHECK"]
    assert record.encode() == orjson.dumps(body)


def test_a_fleet_body_and_an_older_routers_bare_list() -> None:
    endpoint = {"url": "http://e1", "state": "READY", "routable": True, "why": "routable", "junk": [1]}
    fleet = RouterFleet.from_body({"policy": "least_request", "endpoints": [endpoint, "not an object"]})
    assert fleet.by_url()["http://e1"].state is EngineState.READY
    assert RouterFleet.from_body([endpoint]).endpoints[0].routable
