"""Wake on demand: a request for a model whose every engine is SLEEPING (as their supervisors' state
streams say) asks one of their supervisors to wake it (every sleeping member, for an engine in a
serving group, which is routed only whole), once (one wake per model at a time, and an
operation id derived from the sleep's epoch, so that every router asking for the same sleep joins the
same wake), and holds the request until an engine is READY or `hold_seconds` have passed; after that
the proxy answers 503 with Retry-After as for any model without a READY engine. Each wake asked for,
each request held and how each hold ended (`served`: an engine became eligible; `timed_out`) is
counted in the router's metrics. The wake call carries the token of the supervisor it goes to.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson

from corral.engine_state import EngineState
from corral.router.discovery.supervisor_stream import TokenFor, bearer
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.wake_on_demand")


class WakeOnDemand:
    def __init__(
        self, membership: Membership, token_for: TokenFor, hold_seconds: float, metrics: RouterMetrics
    ) -> None:
        self._membership = membership
        self._token_for = token_for
        self.hold_seconds = hold_seconds
        self._metrics = metrics
        self._wakes: dict[str, asyncio.Task[None]] = {}  # model -> its wake call in progress

    def _sleeping(self, model: str) -> list[Endpoint]:
        """Endpoints serving `model` that their supervisor reports SLEEPING; empty unless every
        endpoint serving it is SLEEPING or otherwise out of routing."""
        serving = [e for e in self._membership.endpoints() if model in e.models]
        return [e for e in serving if e.supervisor is not None and e.supervisor.state is EngineState.SLEEPING]

    async def hold(self, model: str) -> None:
        """Return once `model` has an eligible endpoint, or at once when no wake applies, or after
        `hold_seconds`."""
        if self._membership.eligible(model):
            return
        sleeping = self._sleeping(model)
        if not sleeping:
            return
        task = self._wakes.get(model)
        if task is None or task.done():
            # a member of a serving group is routed only with its whole group: wake every sleeping member
            group = [e for e in self._membership.group_members(sleeping[0]) if e in sleeping]
            task = asyncio.create_task(self._wake_all(group or sleeping[:1]), name=f"corral-wake-{model}")
            self._wakes[model] = task
            self._metrics.count_wake(model)
        self._metrics.count_held(model)
        deadline = time.monotonic() + self.hold_seconds
        while time.monotonic() < deadline:
            if self._membership.eligible(model):
                self._metrics.count_hold_outcome(model, "served")
                return
            await asyncio.sleep(0.02)
        self._metrics.count_hold_outcome(model, "timed_out")

    async def _wake_all(self, endpoints: list[Endpoint]) -> None:
        await asyncio.gather(*(self._wake(e) for e in endpoints))

    async def _wake(self, endpoint: Endpoint) -> None:
        view = endpoint.supervisor
        assert view is not None
        body = {"operation_id": f"wake-on-demand-{view.epoch}", "reload": True}
        headers = {"content-type": "application/json", **bearer(self._token_for(endpoint))}
        log.info("every engine of %s sleeps: asking %s to wake %s", endpoint.models, view.url, endpoint.url)
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
                session.post(view.url + "/v1/wake", data=orjson.dumps(body), headers=headers) as resp,
            ):
                if resp.status not in (200, 202):
                    answer = (await resp.read())[:300].decode(errors="replace")
                    log.warning("wake of %s refused: HTTP %d %s", endpoint.url, resp.status, answer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("wake of %s via %s failed: %s", endpoint.url, view.url, exc)
