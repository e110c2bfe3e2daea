"""`corral router --workers 2 --policy prefix` routes as one router (issue 28): requests of a few prompt
groups, each on a fresh connection so that the kernel hands them to both workers, keep each group on
one engine, as `--workers 1` does, whichever worker placed it. Which engine served a request is read
from the simulators' own prefix-cache counters, not from the router."""

from __future__ import annotations

from tests.integration.test_router_passthrough import SIM_ARGS
from tests.integration.test_router_prefix import cache_counters
from tests.support.prefix_routers import ask, served_by_worker, start_prefix_router
from tests.support.procs import start_sim
from tests.support.waits import wait_until

GROUPS = 7
ROUNDS = 6


def test_two_workers_keep_each_prompt_group_on_one_engine() -> None:
    args = (*SIM_ARGS[:-2], "--max-model-len", "2048")
    sims = [start_sim(None, *args) for _ in range(3)]
    engines = [url for _, url in sims]
    router, url = start_prefix_router(engines, workers=2)
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
        # placed as one router places them: new groups dealt over the engines, not piled on one (how
        # evenly is the engines' load scrapes' to say, and varies from run to run, as for peered replicas)
        assert len({where[0] for where in placed.values()}) > 1, placed
    finally:
        router.stop()
        for proc, _ in sims:
            proc.stop()
