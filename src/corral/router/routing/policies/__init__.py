"""Routing policies: given the eligible endpoints and a request, pick one.

A policy only chooses among the candidates it is handed (never an endpoint outside them) and
never waits or does I/O; eligibility is membership's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from corral.router.membership.endpoint import Endpoint


@dataclass(slots=True)
class RouteRequest:
    """What a policy may look at: the model asked for, the request's headers, and the body the proxy
    already parsed (None for multipart), never parsed again."""

    model: str
    headers: Mapping[str, str]
    payload: Mapping[str, Any] | None = None


class Policy(Protocol):
    name: str

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        """Choose one of `candidates` (never empty)."""
        ...


POLICY_NAMES = ("round_robin", "least_request", "session", "prefix", "load")


def build_policy(name: str, session_header: str = "x-session-id", seed: int | None = None) -> Policy:
    from corral.router.routing.policies.least_request import LeastRequest
    from corral.router.routing.policies.round_robin import RoundRobin
    from corral.router.routing.policies.session import SessionAffinity

    if name == "round_robin":
        return RoundRobin()
    if name == "least_request":
        return LeastRequest(seed=seed)
    if name == "session":
        return SessionAffinity(header=session_header, fallback=LeastRequest(seed=seed))
    if name in ("prefix", "load"):
        # Alone, without a scraper: prefix affinity and the load bound work, metrics scorers are neutral.
        from corral.router.routing.config import RoutingConfig
        from corral.router.routing.load_board import LoadBoard
        from corral.router.routing.selector import build_scored

        return build_scored(name, RoutingConfig(), LoadBoard(), session_header, seed)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


__all__ = ["POLICY_NAMES", "Policy", "RouteRequest", "build_policy"]
