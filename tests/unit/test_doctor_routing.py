"""`corral doctor`'s router row from captured views (corral.fleet.checks.doctor_routing): healthy with
what it routes of the fleet, or a finding for a READY engine the router leaves out."""

from __future__ import annotations

from typing import Any

from corral.contracts.router import FleetEndpoint
from corral.fleet.checks.doctor import diagnose_router
from corral.fleet.checks.doctor_routing import NOT_ROUTING_READY
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView

READY: dict[str, Any] = {"state": "READY"}
SLEEPING: dict[str, Any] = {"state": "SLEEPING", "sub_state": "level_1"}


def engine(name: str, url: str, state: dict[str, Any] | None, health: int = 200) -> EngineView:
    sup = None if state is None else f"http://sup-{name}"
    return EngineView(name, sup, url, state=state, health=health, models=[{"id": "m"}])


def rows(engines: list[EngineView], endpoints: list[FleetEndpoint] | None) -> list[tuple[str, str, str]]:
    view = FleetView(FleetTarget("http://router", []), engines=engines, router_endpoints=endpoints)
    return [(d.branch, d.evidence, d.next_command) for d in diagnose_router(view)]


def test_healthy_it_names_what_it_routes_and_why_the_rest_is_not() -> None:
    engines = [engine("engine-0", "http://e0", READY), engine("engine-1", "http://e1", SLEEPING)]
    endpoints = [FleetEndpoint(url="http://e0", routable=True), FleetEndpoint(url="http://e1", why="asleep")]
    ((branch, evidence, command),) = rows(engines, endpoints)
    assert (branch, command) == ("healthy", "-")
    assert "routes 1 of the fleet's 2 engines (engine-0)" in evidence
    assert "not routed: engine-1 SLEEPING" in evidence


def test_a_ready_engine_left_out_is_a_finding_with_the_routers_reason() -> None:
    engines = [engine("engine-0", "http://e0", READY), engine("engine-1", "http://e1", READY)]
    endpoints = [FleetEndpoint(url="http://e0", routable=True), FleetEndpoint(url="http://e1", why="ejected")]
    ((branch, evidence, command),) = rows(engines, endpoints)
    assert branch == NOT_ROUTING_READY and "engine-1 (http://e1): ejected" in evidence
    assert "engine-0" not in evidence and "corral status" in command


def test_an_engine_the_router_does_not_list_and_one_without_a_supervisor() -> None:
    engines = [engine("engine-0", "http://e0", READY), engine("plain", "http://p", None)]
    ((branch, evidence, _),) = rows(engines, [FleetEndpoint(url="http://elsewhere", routable=True)])
    assert branch == NOT_ROUTING_READY
    assert "engine-0 (http://e0): not listed" in evidence and "plain (http://p): not listed" in evidence


def test_an_unhealthy_engine_is_its_own_rows_business_not_the_routers() -> None:
    engines = [engine("engine-0", "http://e0", READY, health=503), engine("plain", "http://p", None, 0)]
    ((branch, evidence, _),) = rows(engines, [])
    assert branch == "healthy" and "routes 0 of the fleet's 2 engines" in evidence
    assert "plain /health no answer" in evidence


def test_no_router_named_no_router_row() -> None:
    view = FleetView(FleetTarget(None, []), engines=[engine("engine-0", "http://e0", READY)])
    assert diagnose_router(view) == []
