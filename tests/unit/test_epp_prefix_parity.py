"""The same held-out prefix workload picked through the endpoint picker (whole ext_proc exchanges) and at
the router's own seam, on two identical cores with the `prefix` policy: the two send a group's requests
to where its prefix already is alike (hit rate within 0.02). A hit: the endpoint picked already served
that group's prefix (decision level; the engines' caches are benchmarks/bench_prefix.py's)."""

from __future__ import annotations

import random

from corral.epp.decision import Picker
from tests.support.epp_fleet import MODEL, epp_pick, ready_core, router_pick

GROUPS, REQUESTS, ENDPOINTS = 24, 480, 8


def workload(seed: int) -> list[tuple[int, dict[str, object]]]:
    rng = random.Random(seed)
    prompts = [f"system prompt of group {g}: " + "policy text " * rng.randint(40, 90) for g in range(GROUPS)]
    return [
        (g, {"model": MODEL, "prompt": prompts[g] + f" question {i}", "max_tokens": 4})
        for i, g in enumerate(
            rng.choices(range(GROUPS), weights=[1 / (g + 1) for g in range(GROUPS)], k=REQUESTS)
        )
    ]


def hit_rate(picks: list[tuple[int, str]]) -> float:
    seen: set[tuple[int, str]] = set()
    hits = 0
    for group, endpoint in picks:
        hits += (group, endpoint) in seen
        seen.add((group, endpoint))
    return hits / len(picks)


async def test_the_picker_and_the_router_place_prefixes_alike() -> None:
    requests = workload(seed=34)
    router_core = ready_core(ENDPOINTS, "prefix")
    router = [(g, router_pick(router_core, body).url) for g, body in requests]
    epp_core = ready_core(ENDPOINTS, "prefix")
    picker = Picker(epp_core)
    epp = [(g, await epp_pick(epp_core, picker, body)) for g, body in requests]
    router_hits, epp_hits = hit_rate(router), hit_rate(epp)
    assert router_hits > 0.8, router_hits  # the workload has prefixes to follow
    assert abs(router_hits - epp_hits) <= 0.02, (router_hits, epp_hits)
    # the picker spread the groups as the router did: several endpoints used, none left idle by both
    assert len({e for _, e in epp}) == len({e for _, e in router}) == ENDPOINTS
