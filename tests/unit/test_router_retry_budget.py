"""The retry budget (retries at most `ratio` of recent requests plus a floor), and the proxy
refusing to retry once it is spent, counted in /metrics."""

from __future__ import annotations

from aiohttp import web

from corral.router.datapath.retry_budget import RetryBudget, RetryBudgetConfig
from tests.unit.test_router_proxy import CHAT, fleet_of


def test_the_floor_then_the_ratio_of_requests_in_the_window() -> None:
    budget = RetryBudget(RetryBudgetConfig(ratio=0.2, min_retries=3, window_seconds=10))
    now = 1000.0
    assert [budget.try_spend(now) for _ in range(4)] == [True, True, True, False]
    for _ in range(50):
        budget.record_request(now)
    assert budget.allowed(now) == 3 + 10
    spent = sum(budget.try_spend(now + 1) for _ in range(20))
    assert spent == 10  # 13 allowed, 3 already spent
    # Once the ten-second window has moved past all of it, only the floor is left.
    assert budget.allowed(now + 11) == 3
    assert [budget.try_spend(now + 11.5) for _ in range(4)] == [True, True, True, False]


async def test_a_sick_fleet_gets_no_retries_once_the_budget_is_spent() -> None:
    async def abort(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()  # connection closed before any byte
        return web.StreamResponse()

    async with fleet_of(
        3, max_retries=2, eject_seconds=0.0, retry_budget=RetryBudgetConfig(ratio=0.0, min_retries=2)
    ) as f:
        for engine in f.engines:
            engine.behaviour = abort
        statuses = [(await f.post(CHAT))[0] for _ in range(5)]
        assert statuses == [503] * 5
        posts = sum(e.posts for e in f.engines)
        assert posts == 3 + 4  # the first request tried 3 engines, the other four one each
        metrics = await (await f.client.get(f.url + "/metrics")).text()
        assert "corral_router_retries_total 2.0" in metrics
        assert "corral_router_retry_budget_exhausted_total 4.0" in metrics
