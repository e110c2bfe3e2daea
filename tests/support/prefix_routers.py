"""Routers with `--policy prefix` over simulators, for the tests of prefix placement across a router's
workers (`--workers N`) and across peered replicas (`--peer`): start them, ask them one chat of a prompt
group, and read which worker served what."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from corral.engine.metrics_text import samples
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

SYSTEM = "You answer questions about the tides and the sea. " * 12  # ~600 characters


def prefix_router_args(
    port: int,
    engines: Sequence[str],
    workers: int = 1,
    peers: Sequence[str] = (),
    token: Path | None = None,
) -> list[str]:
    """`corral router` on 127.0.0.1:`port`, `--policy prefix` over `engines`, `--peer` each of `peers`
    with the token file `token` (both or neither)."""
    if bool(peers) != (token is not None):
        raise ValueError("peers and a peer token go together")
    args = ["router", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    args += ["--policy", "prefix", "--models-refresh-seconds", "0.5"]
    for engine in engines:
        args += ["--backend", engine]
    for peer in peers:
        args += ["--peer", peer]
    if token is not None:
        args += ["--peer-token-file", str(token)]
    return args


def routable(url: str) -> int:
    """How many endpoints the router at `url` would route to now (its `/v1/fleet`)."""
    with urllib.request.urlopen(url + "/v1/fleet", timeout=2.0) as resp:
        return sum(bool(e["routable"]) for e in json.loads(resp.read())["endpoints"])


def until_serving(proc: CorralProcess, url: str, engines: int, timeout: float = 30.0) -> None:
    """Until the router at `url` answers and routes to `engines` endpoints."""
    proc.wait_http(url + "/livez")
    try:
        wait_until(lambda: routable(url) == engines, timeout, f"{engines} routable endpoints at {url}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{proc.output()[-3000:]}") from None


def start_prefix_router(
    engines: Sequence[str], workers: int = 1, peers: Sequence[str] = (), token: Path | None = None
) -> tuple[CorralProcess, str]:
    """One router (see `prefix_router_args`), serving once every engine is routable."""
    port = free_port()
    proc = CorralProcess(prefix_router_args(port, engines, workers, peers, token))
    url = f"http://127.0.0.1:{port}"
    try:
        until_serving(proc, url, len(engines))
    except BaseException:
        proc.stop()
        raise
    return proc, url


def start_peered_routers(
    engines: Sequence[str], token: Path | None, workers: tuple[int, int] = (1, 1)
) -> list[tuple[CorralProcess, str]]:
    """Two routers of `workers` processes each over the same engines, each the other's `--peer` when
    `token` is given (each must know the other's port before either starts)."""
    ports = [free_port(), free_port()]
    routers: list[tuple[CorralProcess, str]] = []
    try:
        for (mine, theirs), count in zip((ports, ports[::-1]), workers, strict=True):
            peers = [f"http://127.0.0.1:{theirs}"] if token is not None else []
            proc = CorralProcess(prefix_router_args(mine, engines, count, peers, token))
            routers.append((proc, f"http://127.0.0.1:{mine}"))
        for proc, url in routers:
            until_serving(proc, url, len(engines))
    except BaseException:
        for proc, _ in routers:
            proc.stop()
        raise
    return routers


def ask(router: str, group: int, turn: int) -> None:
    """One chat completion of prompt group `group` on a connection of its own (urllib opens one per
    request); fails unless it is answered 200."""
    body = {
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": f"Group {group}. {SYSTEM}"},
            {"role": "user", "content": f"turn {turn}: what is the tide at noon?"},
        ],
        "max_tokens": 2,
    }
    request = urllib.request.Request(
        router + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()
        assert resp.status == 200


def served_by_worker(router: str) -> dict[str, float]:
    """Requests each worker of the router at `router` counted (`corral_router_requests_total`)."""
    with urllib.request.urlopen(router + "/metrics", timeout=10) as resp:
        page = resp.read().decode()
    served: dict[str, float] = {}
    for sample in samples(page, ("corral_router_requests_total",), strict=True):
        worker = sample.labels["worker"]
        served[worker] = served.get(worker, 0.0) + sample.value
    return served
