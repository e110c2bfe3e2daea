"""`corral router --workers 2 --policy prefix` routes as one router (issue 28): requests of a few prompt
groups, each on a fresh connection so that the kernel hands them to both workers, keep each group on
one engine, as `--workers 1` does, whichever worker placed it. Which engine served a request is read
from the simulators' own prefix-cache counters, not from the router."""

from __future__ import annotations

import json
import urllib.request

from corral.engine.metrics_text import samples
from tests.integration.test_router_passthrough import SIM_ARGS, start_router
from tests.integration.test_router_prefix import cache_counters
from tests.support.procs import start_sim
from tests.support.waits import wait_until

SYSTEM = "You answer questions about the tides and the sea. " * 12  # ~600 characters
GROUPS = 7
ROUNDS = 6


def ask(router: str, group: int, turn: int) -> None:
    """One chat completion on a connection of its own (urllib opens one per request)."""
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
    with urllib.request.urlopen(router + "/metrics", timeout=10) as resp:
        page = resp.read().decode()
    served: dict[str, float] = {}
    for sample in samples(page, ("corral_router_requests_total",), strict=True):
        worker = sample.labels["worker"]
        served[worker] = served.get(worker, 0.0) + sample.value
    return served


def test_two_workers_keep_each_prompt_group_on_one_engine() -> None:
    args = (*SIM_ARGS[:-2], "--max-model-len", "2048")
    sims = [start_sim(None, *args) for _ in range(3)]
    engines = [url for _, url in sims]
    router, url = start_router(*engines, extra=("--workers", "2", "--policy", "prefix"))
    try:
        placed: dict[int, list[str]] = {g: [] for g in range(GROUPS)}
        before = [cache_counters(e)[0] for e in engines]
        for turn in range(ROUNDS):
            for group in range(GROUPS):
                ask(url, group, turn)
                # the engine whose own prefix-cache query count moved served it
                moved: list[str] = []

                def one_moved(previous: list[float] = before, found: list[str] = moved) -> bool:
                    now = [cache_counters(e)[0] for e in engines]
                    found[:] = [e for e, a, b in zip(engines, previous, now, strict=True) if b > a]
                    previous[:] = now
                    return bool(found)

                wait_until(one_moved, 10.0, "an engine's prefix-cache queries to move")
                assert len(moved) == 1, moved
                placed[group].append(moved[0])
        served = served_by_worker(url)
        assert set(served) == {"w1", "w2"} and min(served.values()) >= 5, served  # both workers took some
        split = {g: sorted(set(where)) for g, where in placed.items() if len(set(where)) > 1}
        assert not split, f"groups served by more than one engine: {split}"
        # placed as one router places them: new groups dealt over every engine
        assert len({where[0] for where in placed.values()}) == len(engines), placed
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()
