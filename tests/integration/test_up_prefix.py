"""`corral up --policy prefix`: the local fleet's engines publish their KV-cache events on Unix sockets in the
fleet's log directory (never a TCP port: the events carry prompt tokens), each supervisor names the address on
its state stream, and the router indexes them: a prompt an engine cached behind the router's back (sent to it
directly) is routed to that engine, which only its events could have told the router."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_router_kv_events import _body, _fleet, _post, _routed_to, _wait_indexed
from tests.integration.test_verify import start_up, stop


def test_a_prefix_fleet_routes_by_its_engines_kv_events(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    up, url = start_up("--policy", "prefix", "--log-dir", str(logs), state_home=tmp_path)
    try:
        endpoints = sorted(_fleet(url))
        assert len(endpoints) == 2, endpoints
        for e in _fleet(url).values():
            published = (e["supervisor"] or {}).get("kv_events") or ""
            assert published.startswith(f"ipc://{logs}/engine-"), e
        # four prompt groups, each cached on one engine directly (two each): no router has seen them
        home = {group: endpoints[group % 2] for group in range(4)}
        for group, engine in home.items():
            _post(engine, _body(group))
        _wait_indexed(up, url, {engine: 16 for engine in endpoints})
        assert {group: _routed_to(url, _body(group)) for group in home} == home
    finally:
        stop(up)
