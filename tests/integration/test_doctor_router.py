"""`corral doctor`'s router row (issue 32): the help says it walks the tree "for every engine and the
router", so the router always has a row; healthy, it says how many of the fleet's engines the router
routes; a READY engine the router does not route is a finding. Real supervisor, simulator and router
on loopback."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.integration.test_doctor import Supervised, start, supervised  # noqa: F401 - a fixture
from tests.support.procs import CorralProcess, free_port, start_sim


def doctor_json(*args: str) -> tuple[int, dict[str, dict[str, str]]]:
    proc = CorralProcess(["doctor", "--json", *args])
    code = proc.wait_exit(60)
    body = orjson.loads(proc.output())  # the JSON shape is the contract (corral.doctor/v1)
    return code, {f["engine"]: f for f in body["findings"]}


def router_for(backend: str) -> tuple[CorralProcess, str]:
    port = free_port()
    router = CorralProcess(["router", "--port", str(port), "--backend", backend])
    router.wait_http(f"http://127.0.0.1:{port}/health")
    return router, f"http://127.0.0.1:{port}"


def test_the_router_has_a_healthy_row_naming_the_engines_it_routes(
    supervised: list[Supervised],  # noqa: F811
    tmp_path: Path,
) -> None:
    s = start(supervised, tmp_path)
    s.wait_for("READY")
    router, url = router_for(s.engine_url)
    try:
        code, found = doctor_json("--router", url, "--supervisor", s.url)
        assert code == 0, found
        assert found["router"]["branch"] == "healthy", found
        assert "routes 1 of the fleet's 1 engines" in found["router"]["evidence"], found
    finally:
        router.stop()


def test_a_ready_engine_the_router_does_not_route_is_a_finding(
    supervised: list[Supervised],  # noqa: F811
    tmp_path: Path,
) -> None:
    s = start(supervised, tmp_path)
    s.wait_for("READY")
    other, other_url = start_sim()
    router, url = router_for(other_url)  # the router knows another engine, not the supervised one
    try:
        code, found = doctor_json("--router", url, "--supervisor", s.url)
        assert code == 1, found
        row = found["router"]
        assert row["branch"] == "router/not-routing-ready-engine", found
        assert s.engine_url in row["evidence"] and "not listed" in row["evidence"], row
        assert "--supervised" in row["next"], row
    finally:
        router.stop()
        other.stop()
