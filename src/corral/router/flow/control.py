"""Flow control as the router's app holds it: the gate the proxy asks, its /metrics collector, and the
engine-metrics scraper it needs when routing does not already run one (a policy that reads no engine
metrics, such as round_robin, starts none)."""

from __future__ import annotations

from collections.abc import Callable

from corral.router.flow.config import FlowConfig
from corral.router.flow.gate import FlowGate
from corral.router.flow.host_flows import HostFlows
from corral.router.flow.saturation import Saturation
from corral.router.flow.telemetry import FlowCollector
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.routing.config import RoutingConfig
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.load_scraper import LoadScraper
from corral.router.telemetry.engine_input import EngineInputRefusals


class FlowControl:
    def __init__(
        self,
        config: FlowConfig,
        membership: Membership,
        board: LoadBoard,
        routing_scrapes: bool,
        routing: RoutingConfig,
        refusals: EngineInputRefusals | None = None,
        host: HostFlows | None = None,
    ) -> None:
        eligible: Callable[[str], list[Endpoint]] = membership.eligible
        # `--workers N`: the host's counts per flow (`host`), so each worker shares out all the host's slots
        self.gate = FlowGate(config, Saturation(config, board), eligible, host)
        self.collector = FlowCollector(self.gate.stats)
        self._scraper = (
            None
            if routing_scrapes
            else LoadScraper(
                board,
                membership.endpoints,
                routing.scrape_interval,
                budget=routing.scrape_budget,
                stale_after=routing.stale_after,
                refusals=refusals,
            )
        )

    async def start(self) -> None:
        if self._scraper is not None:
            await self._scraper.start()

    async def stop(self) -> None:
        await self.gate.stop()
        if self._scraper is not None:
            await self._scraper.stop()
