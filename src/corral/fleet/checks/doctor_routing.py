"""`corral doctor`'s router row: whether the router answers and routes to the fleet's engines. A READY
engine (its supervisor READY, its /health 200) that the router does not route is a finding, with the
router's own reason; otherwise the router's row is healthy and says how many of the fleet's engines it
routes, and why each other one is not (that engine's own row has the branch)."""

from __future__ import annotations

from corral.engine_state import EngineState
from corral.fleet.checks.probe import EngineView, FleetView

NOT_ROUTING_READY = "router/not-routing-ready-engine"

Finding = tuple[str, str, str, str]  # member, branch, evidence, next command


def _serving(engine: EngineView) -> bool:
    """READY by its supervisor's word (an engine without one: by its /health alone)."""
    ready = engine.lifecycle == EngineState.READY or (engine.supervisor_url is None and engine.state is None)
    return bool(engine.engine_url) and engine.health == 200 and ready


def _said(engine: EngineView) -> str:
    if engine.supervisor_url is None and engine.state is None:
        return f"/health {engine.health or 'no answer'}"
    return engine.lifecycle


def not_routing_ready(view: FleetView) -> Finding | None:
    """The branch for READY engines the router leaves out, or None."""
    if view.router_endpoints is None:
        return None
    listed = {ep.url: ep for ep in view.router_endpoints}
    missed: list[str] = []
    for engine in view.engines:
        if not _serving(engine):
            continue
        ep = listed.get(engine.engine_url or "")
        if ep is None:
            missed.append(f"{engine.name} ({engine.engine_url}): not listed")
        elif not ep.routable:
            missed.append(f"{engine.name} ({engine.engine_url}): {ep.why or 'not routable'}")
    if not missed:
        return None
    return (
        "router",
        NOT_ROUTING_READY,
        "READY with /health 200, but the router does not route it: " + "; ".join(missed),
        "check the router's discovery of it (--backend, --supervised ENGINE=SUPERVISOR, or the pods it "
        f"watches) and its reason above; then: corral status {view.target.cli_flags}".rstrip(),
    )


def router_healthy_evidence(view: FleetView) -> str:
    """The healthy row's evidence: the router answered, and what it routes of this fleet."""
    endpoints = view.router_endpoints or []
    routable = {ep.url for ep in endpoints if ep.routable}
    engines = [e for e in view.engines if e.engine_url]
    routed = [e.name for e in engines if e.engine_url in routable]
    words = f"answers /v1/fleet; routes {len(routed)} of the fleet's {len(engines)} engines"
    if routed:
        words += f" ({', '.join(routed)})"
    others = [f"{e.name} {_said(e)}" for e in engines if e.engine_url not in routable]
    if others:
        words += f"; not routed: {', '.join(others)}"
    ours = {e.engine_url for e in engines}
    foreign = len(routable - ours)
    if foreign and engines:
        words += f"; and {foreign} endpoint{'' if foreign == 1 else 's'} outside this fleet"
    return words
