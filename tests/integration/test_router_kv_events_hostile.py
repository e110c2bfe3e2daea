"""A compromised engine's KV events cost that engine its feed, never the router's routing (issue 27,
finding 4): a real router (`--policy prefix --tokenizer sim`) follows an honest `corral sim` and a
hostile publisher standing in for a second engine's events. After a `block_size: 0` event and after a
payload nested past the decoder's recursion, prefix-routed requests still answer 200, the refusals are
counted on `/metrics`, and the honest engine's events are still indexed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.integration.test_router_passthrough import wait_routable
from tests.support.hostile_kv import HostilePublisher, batch_payload, nested_payload, stored_event
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.prom import sample, scrape
from tests.support.waits import wait_until

ARGS = ("--seed", "0", "--ttft-base-ms", "2", "--itl-ms", "1", "--max-model-len", "4096")


def _post(url: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(
        url + "/v1/completions", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10.0) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _body(n: int) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": f"Prompt {n}: the tides of the sea. " * 12, "max_tokens": 2}


def _fleet(url: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        return {e["url"]: e for e in orjson.loads(resp.read())["endpoints"]}


def _index(url: str, engine: str) -> dict[str, Any]:
    return ((_fleet(url)[engine].get("kv_events") or {}).get("index")) or {}


def _refused(url: str, reason: str) -> float:
    found = sample(scrape(url + "/metrics"), "corral_router_engine_input_refused_total", reason=reason)
    return found or 0.0


def test_hostile_kv_events_cost_their_engine_its_feed_not_the_routers_routing(tmp_path: Path) -> None:
    hostile = HostilePublisher(free_port(), free_port())
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    honest, honest_url = start_sim(None, *ARGS, "--kv-events-config", json.dumps(config))
    other, other_url = start_sim(None, *ARGS)
    backends = tmp_path / "backends"
    # the hostile engine first: the index's first engine is the one whose block size a pick reads
    backends.write_text(
        f"{other_url} kv_events={hostile.address}\n{honest_url} kv_events=tcp://*:{pub},tcp://*:{replay}\n"
    )
    port = free_port()
    router = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--backends-file", str(backends),
         "--models-refresh-seconds", "0.5", "--policy", "prefix", "--tokenizer", "sim"]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        router.wait_http(url + "/v1/fleet")
        wait_routable(router, url, 2)
        hostile.publish(batch_payload(stored_event([11], list(range(16)), 16)))
        wait_until(
            lambda: _index(url, other_url).get("blocks", 0) >= 1, 20, "the hostile engine's block indexed"
        )

        hostile.publish(batch_payload(stored_event([12], [], 0)))
        # received: refused (now), or taken into the index as its block size (before issue 27)
        wait_until(
            lambda: _refused(url, "out_of_bounds") >= 1 or _index(url, other_url).get("block_size") == 0,
            20,
            "the block_size 0 event to reach the router",
        )
        codes = [_post(url, _body(n)) for n in range(6)]
        assert codes == [200] * 6, (codes, router.output()[-3000:])

        hostile.publish(nested_payload(5000))
        wait_until(lambda: _refused(url, "undecodable") >= 1, 20, "the nested payload refused")
        codes = [_post(url, _body(n)) for n in range(6)]
        assert codes == [200] * 6, (codes, router.output()[-3000:])

        # the honest engine's feed still indexes what it caches
        before = _index(url, honest_url).get("blocks", 0)
        assert _post(honest_url, _body(100)) == 200
        wait_until(
            lambda: _index(url, honest_url).get("blocks", 0) > before, 20, "the honest engine's blocks"
        )
        feed = _fleet(url)[other_url]["kv_events"]
        assert feed["refused"] >= 2 and "refused" in (feed["error"] or ""), feed
        # the log is the contract here: an engine's payload bytes never reach it
        assert "9191" not in router.output()  # no payload bytes in the log
    finally:
        router.stop()
        honest.stop()
        other.stop()
        hostile.close()
