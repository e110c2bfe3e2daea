"""One huge prompt does not stall the router (issue 27, finding 6): with `--tokenizer sim` and an engine
whose KV events the router follows, a 48 MiB prompt is tokenized only as far as routing needs
(`prompt_tokens.MAX_ROUTED_CHARS`), so `/health` answers while that request is still being handled: its
body fully sent first, its answer not yet back. Before, the whole prompt was tokenized on the event loop
(a 30 MiB prompt held `/health` 6.5 s)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from pathlib import Path

import orjson

from tests.integration.test_router_passthrough import wait_routable
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import http_status, wait_until

ARGS = ("--seed", "0", "--ttft-base-ms", "2", "--itl-ms", "1", "--max-model-len", "2048")
PROMPT_BYTES = 48 << 20


def _indexed(url: str, engine: str) -> bool:
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        endpoints = {e["url"]: e for e in orjson.loads(resp.read())["endpoints"]}
    return bool(((endpoints[engine].get("kv_events") or {}).get("index") or {}).get("blocks"))


def test_health_answers_while_a_huge_prompt_is_handled(tmp_path: Path) -> None:
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    sim, sim_url = start_sim(None, *ARGS, "--kv-events-config", json.dumps(config))
    backends = tmp_path / "backends"
    backends.write_text(f"{sim_url} kv_events=tcp://*:{pub},tcp://*:{replay}\n")
    port = free_port()
    router = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--backends-file", str(backends),
         "--models-refresh-seconds", "0.5", "--policy", "prefix", "--tokenizer", "sim",
         "--max-body-size", str(PROMPT_BYTES + (1 << 20))]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        router.wait_http(url + "/v1/fleet")
        wait_routable(router, url, 1)
        small = {"model": "sim-model", "prompt": "The tides of the sea. " * 40, "max_tokens": 2}
        urllib.request.urlopen(
            urllib.request.Request(sim_url + "/v1/completions", data=orjson.dumps(small)), timeout=10
        ).read()
        wait_until(lambda: _indexed(url, sim_url), 20, "the engine's blocks indexed (prompts are tokenized)")

        body = orjson.dumps(
            {"model": "sim-model", "prompt": "the sea and " * (PROMPT_BYTES // 12), "max_tokens": 2}
        )
        events: list[str] = []
        sent = threading.Event()

        def big_request() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
                head = (
                    f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode()
                sock.sendall(head + body)
                events.append("big body sent")
                sent.set()
                answer = sock.recv(64)
                events.append(f"big answered {answer[:12]!r}")

        thread = threading.Thread(target=big_request, daemon=True)
        thread.start()
        assert sent.wait(60), "the big body was not taken"

        def health() -> bool:
            if http_status(url + "/health", timeout=0.5) == 200:
                events.append("health 200")
                return True
            return False

        # the router still answers its probes while the huge prompt is in hand
        wait_until(health, 5, "/health to answer while the huge prompt is handled", interval=0.05)
        thread.join(120)
        assert events.index("big body sent") < events.index("health 200"), events
        answered = [e for e in events if e.startswith("big answered")]
        assert answered and events.index("health 200") < events.index(answered[0]), events
    finally:
        router.stop()
        sim.stop()
