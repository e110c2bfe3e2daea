"""Prefix routing from the engines' own KV events: two `corral sim --kv-events-config` engines and real
routers (`--policy prefix --tokenizer sim`, addresses from the backends file). Prompts cached on an
engine behind the routers' backs (sent to it directly) are routed to it, which no router's own memory
could know, and two router replicas fed by the same events pick the same engines; a supervised engine's
supervisor publishes where its events are, and the router follows them."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from corral.contracts.router import RouterFleet
from tests.integration.test_router_passthrough import wait_routable
from tests.integration.test_supervisor_support import supervised
from tests.support.procs import CorralProcess, free_port, start_sim

SYSTEM = "You answer questions about the tides and the sea, briefly and with care. " * 10
ARGS = ("--seed", "0", "--ttft-base-ms", "2", "--itl-ms", "1", "--max-model-len", "2048")


def _body(group: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": f"Group {group}. {SYSTEM}"},
            {"role": "user", "content": "What makes a spring tide?"},
        ],
        "max_tokens": 2,
    }


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10.0) as resp:
        assert resp.status == 200


def _fleet(url: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        return {e["url"]: e for e in orjson.loads(resp.read())["endpoints"]}


def _routed_to(router: str, body: dict[str, Any]) -> str:
    """The engine the router sent `body` to (the one whose requests_sent moved)."""
    before = {u: e["requests_sent"] for u, e in _fleet(router).items()}
    _post(router, body)
    after = {u: e["requests_sent"] for u, e in _fleet(router).items()}
    moved = [u for u in after if after[u] != before.get(u)]
    assert len(moved) == 1, (before, after)
    return moved[0]


def _start_router(backends: Path, *extra: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--backends-file", str(backends),
         "--models-refresh-seconds", "0.5", "--policy", "prefix", "--tokenizer", "sim", *extra]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/v1/fleet")
    wait_routable(proc, url, 2)
    return proc, url


def _wait_indexed(router: CorralProcess, url: str, blocks: dict[str, int], timeout: float = 20.0) -> None:
    """Until the router's index holds at least `blocks[engine]` blocks of each engine."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = {u: (e["kv_events"] or {}).get("index") for u, e in _fleet(url).items()}
        if all((seen.get(u) or {}).get("blocks", 0) >= n for u, n in blocks.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"the router did not index {blocks}: {seen}\n{router.output()}")


def test_routers_route_to_the_engine_whose_events_say_it_holds_the_prompt(tmp_path: Path) -> None:
    sims, lines = [], []
    for _ in range(2):
        pub, replay = free_port(), free_port()
        config = {
            "enable_kv_cache_events": True,
            "endpoint": f"tcp://*:{pub}",
            "replay_endpoint": f"tcp://*:{replay}",
        }
        sims.append(start_sim(None, *ARGS, "--kv-events-config", json.dumps(config)))
        lines.append(f"{sims[-1][1]} kv_events=tcp://*:{pub},tcp://*:{replay}")
    backends = tmp_path / "backends"
    backends.write_text("\n".join(lines) + "\n")
    routers = [_start_router(backends), _start_router(backends)]
    try:
        # eight prompt groups cached behind the routers' backs, in an order that neither ring homes nor
        # a placement alternating by load would guess
        holder = {g: sims[side][1] for g, side in enumerate((0, 0, 1, 1, 0, 1, 1, 0))}
        for g, sim_url in holder.items():
            _post(sim_url, _body(g))
        for proc, url in routers:
            _wait_indexed(proc, url, {sims[0][1]: 4 * 8, sims[1][1]: 4 * 8})
        for proc, url in routers:
            picks = {g: _routed_to(url, _body(g)) for g in holder}
            assert picks == holder, (picks, holder, proc.output())
    finally:
        for proc, _ in routers:
            proc.stop()
        for proc, _ in sims:
            proc.stop()


def test_a_supervised_engine_publishes_its_kv_events_address_and_the_router_follows_it() -> None:
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    # the engine is on the supervisor's loopback: the state line keeps the wildcard, which each router
    # reads as the host it reaches the engine at (127.0.0.1 would be the router's own host elsewhere)
    published = f"tcp://*:{pub},tcp://*:{replay}"
    with supervised(sim_args=(*ARGS, "--kv-events-config", json.dumps(config))) as sup:
        state = sup.wait_state("READY", 60)
        assert state["kv_events"] == published, state
        port = free_port()
        router = CorralProcess(
            ["router", "--host", "127.0.0.1", "--port", str(port),
             "--supervised", f"{sup.engine_url}={sup.url}",
             "--policy", "prefix", "--tokenizer", "sim", "--models-refresh-seconds", "0.5"]
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            router.wait_http(url + "/v1/fleet")
            wait_routable(router, url, 1)
            _post(url, _body(0))  # its events may precede the router's subscription: the replay brings them
            _wait_indexed(router, url, {sup.engine_url: 8})
            [endpoint] = RouterFleet.from_body(
                orjson.loads(urllib.request.urlopen(url + "/v1/fleet").read())
            ).endpoints
            assert endpoint.supervisor is not None and endpoint.supervisor.kv_events == published
            assert (
                endpoint.kv_events is not None and endpoint.kv_events["endpoint"] == f"tcp://127.0.0.1:{pub}"
            )
        finally:
            router.stop()
