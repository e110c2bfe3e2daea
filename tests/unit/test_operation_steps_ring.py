"""The router's ring of runbook steps for the dashboard's recent events: one record per step begun and
one per operation ended, repeats of what the stream already said (state lines carrying the operation,
the first line after a reconnect) record nothing, and only the last STEPS_KEPT are kept."""

from __future__ import annotations

from itertools import count, pairwise

from corral.contracts.router import RouterFleet
from corral.contracts.supervisor import OperationInFlight
from corral.router.membership.operation_steps import STEPS_KEPT, OperationSteps

URL = "http://127.0.0.1:41002"


def op(step: str, since: float, op_id: str | None = "nap") -> OperationInFlight:
    return OperationInFlight(kind="sleep", id=op_id, detail="level 1", step=step, since=since)


def ring() -> OperationSteps:
    ticks = count(100)
    return OperationSteps(clock=lambda: float(next(ticks)))


def test_each_step_begun_and_the_end_once_repeats_nothing() -> None:
    steps = ring()
    said = [
        None,  # a READY state line: nothing in flight
        op("precheck", 1.0, None),
        op("precheck", 1.0, None),  # a state line carrying the same operation
        op("remove_from_routing", 2.0),
        op("drain_policy", 3.0),
        op("drain_policy", 3.0),  # the first line after a reconnect
        op("execute", 4.0),
        None,  # ended
        None,  # a later state line
    ]
    for before, now in pairwise(said):
        steps.heard(URL, "engine-0", before, now)
    body = steps.to_json()
    assert [(s["step"], s["ended"]) for s in body] == [
        ("precheck", False),
        ("remove_from_routing", False),
        ("drain_policy", False),
        ("execute", False),
        (None, True),
    ]
    assert all(s["name"] == "engine-0" and s["kind"] == "sleep" and s["detail"] == "level 1" for s in body)
    assert body[0]["id"] is None and body[-1]["id"] == "nap"  # the end names the operation that ended
    assert [s["at"] for s in body] == sorted(s["at"] for s in body)  # oldest first, as left_routing
    # what a reader of /v1/fleet gets
    fleet = RouterFleet.from_body({"endpoints": [], "operation_steps": body})
    assert [s.step for s in fleet.operation_steps] == [
        "precheck",
        "remove_from_routing",
        "drain_policy",
        "execute",
        None,
    ]
    assert fleet.operation_steps[-1].ended


def test_a_new_step_of_the_same_name_is_recorded_and_an_operation_replaced_without_an_end_too() -> None:
    steps = ring()
    steps.heard(URL, "engine-0", op("drain_policy", 3.0), op("drain_policy", 9.0, "other"))
    steps.heard(URL, "engine-0", None, None)
    assert [(s["id"], s["step"]) for s in steps.to_json()] == [("other", "drain_policy")]


def test_only_the_last_steps_are_kept() -> None:
    steps = ring()
    before = None
    for i in range(STEPS_KEPT + 7):
        now = op("execute", float(i), f"op-{i}")
        steps.heard(URL, None, before, now)
        before = now
    body = steps.to_json()
    assert len(body) == STEPS_KEPT and body[0]["id"] == "op-7" and body[-1]["id"] == f"op-{STEPS_KEPT + 6}"
