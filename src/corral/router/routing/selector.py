"""Choosing a policy, in one place: building any policy by name, the policy each request is routed by
(the one its header names, else its model's, else the default), and the background scraper that feeds
the load board the scored policies read, started and stopped with the app."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from corral.policy_names import POLICY_NAMES
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.config import PolicyConfigError, RoutingConfig, check_policy_names
from corral.router.routing.load_board import LoadBoard
from corral.router.routing.load_scraper import LoadScraper
from corral.router.routing.pipeline import LOAD_WEIGHTS, PREFIX_WEIGHTS, ScoredPolicy
from corral.router.routing.policies import LeastRequest, RoundRobin, SessionAffinity
from corral.router.routing.prefix_holders import PrefixHolders
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import Policy, RouteRequest
from corral.router.routing.slow_start import SlowStart
from corral.router.telemetry.engine_input import EngineInputRefusals

log = logging.getLogger("corral.router.scoring")

SCORED_BUILTINS = {"prefix": PREFIX_WEIGHTS, "load": LOAD_WEIGHTS}


class PolicySelector:
    """A `Policy` that hands each pick to the policy chosen for that request."""

    def __init__(
        self, policies: dict[str, Policy], default: str, by_model: dict[str, str], header: str
    ) -> None:
        self.policies = policies
        self.default = policies[default]
        self.name = default
        self.by_model = {model: policies[name] for model, name in by_model.items()}
        self.header = header.lower()

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        named = request.headers.get(self.header)
        policy = self.policies.get(named) if named else None
        if policy is None:
            policy = self.by_model.get(request.model, self.default)
        return policy.pick(candidates, request)


def build_scored(
    name: str,
    config: RoutingConfig,
    board: LoadBoard,
    session_header: str,
    seed: int | None = None,
    holders: PrefixHolders | None = None,
) -> ScoredPolicy:
    spec = config.policies.get(name)
    weights = spec.weights if spec is not None else SCORED_BUILTINS[name]
    eps = spec.eps if spec is not None and spec.eps is not None else config.eps
    # `load` has no prefix scorer, so its placement is moot; `prefix` places as the config says
    placement = spec.placement if spec is not None else config.prefix_placement
    return ScoredPolicy(
        name,
        weights,
        board,
        eps=eps,
        block_chars=config.block_chars,
        key_blocks=config.key_blocks,
        session_header=session_header,
        seed=seed,
        holders=holders,
        placement=placement,
    )


def build_policy(name: str, session_header: str = "x-session-id", seed: int | None = None) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_request":
        return LeastRequest(seed=seed)
    if name == "session":
        return SessionAffinity(header=session_header, fallback=LeastRequest(seed=seed))
    if name in SCORED_BUILTINS:
        # Alone, without a scraper: prefix affinity and the load bound work, metrics scorers are neutral.
        return build_scored(name, RoutingConfig(), LoadBoard(), session_header, seed, PrefixMemory())
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


class Routing:
    """The router's policy (a `PolicySelector` behind the `SlowStart` cap), the metrics scraper behind
    its scored policies, and the prefix memory their prefix scorers share (`prefix_memory`, shown per
    endpoint in /v1/fleet)."""

    def __init__(
        self,
        default_policy: str,
        config: RoutingConfig,
        session_header: str,
        endpoints: Callable[[], list[Endpoint]],
        seed: int | None = None,
        prefix_memory: PrefixMemory | None = None,
        slow_start_seconds: float = 0.0,
        prefix_holders: PrefixHolders | None = None,
        refusals: EngineInputRefusals | None = None,
    ) -> None:
        self.config = config
        self.board = LoadBoard(stale_after=config.stale_seconds())
        self.prefix_memory = (
            prefix_memory
            if prefix_memory is not None
            else PrefixMemory(block_chars=config.block_chars, key_blocks=config.key_blocks)
        )
        policies: dict[str, Policy] = {}
        for name in ("round_robin", "least_request", "session"):
            policies[name] = build_policy(name, session_header, seed=seed)
        for name in (*SCORED_BUILTINS, *config.policies):
            # the KV-event index when the engines publish events (it falls back to the memory per endpoint)
            holders = prefix_holders if prefix_holders is not None else self.prefix_memory
            policies[name] = build_scored(name, config, self.board, session_header, seed, holders)
        default = config.policy or default_policy
        check_policy_names(config, policies, "routing config")
        if default not in policies:
            raise PolicyConfigError(f"unknown policy {default!r}; known: {', '.join(sorted(policies))}")
        self.selector = PolicySelector(policies, default, config.models, config.header)
        ramp = config.slow_start_seconds if config.slow_start_seconds is not None else slow_start_seconds
        self.slow_start = SlowStart(self.selector, ramp, config.slow_start_models)
        # what the data path picks with (with `--workers N`, reading the sibling workers' picks first)
        self.policy: Policy = self.slow_start
        in_use = {default, *config.models.values()}
        # Scrape only when a configured policy reads engine metrics; a header naming a scored policy
        # on a router that does not scrape still gets prefix affinity and the load bound.
        needs = any(
            isinstance(p, ScoredPolicy) and p.uses_metrics for n, p in policies.items() if n in in_use
        )
        self.scraper = (
            LoadScraper(
                self.board,
                endpoints,
                config.scrape_interval,
                budget=config.scrape_budget,
                stale_after=config.stale_after,
                refusals=refusals,
            )
            if needs
            else None
        )

    async def start(self) -> None:
        if self.scraper is not None:
            await self.scraper.start()
            log.info(
                "scraping engine /metrics every %.3f s or less often, %.3g scrapes/s at most (stale after "
                "5 periods unless stale_after is set)",
                self.config.scrape_interval,
                self.config.scrape_budget,
            )

    async def stop(self) -> None:
        if self.scraper is not None:
            await self.scraper.stop()
