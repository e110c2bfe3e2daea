"""What routing decides on and how: the request a policy looks at and the `Policy` protocol every
policy and the selector meet (a leaf: it imports no other routing module but `names`, so every one of
them can import it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from corral.router.membership.endpoint import Endpoint


@dataclass(slots=True)
class RouteRequest:
    """What a policy may look at: the model asked for, the request's headers, and the body the proxy
    already parsed (None for multipart), never parsed again. `derived` keeps what routing computed
    from the body (prefix keys, block hashes), by its owner's name, so one pick computes it once."""

    model: str
    headers: Mapping[str, str]
    payload: Mapping[str, Any] | None = None
    derived: dict[str, Any] | None = None
    # Set by a pick that prices placements (`prefill_cost`): the uncached prompt tokens it expects the
    # chosen engine to compute; the proxy counts them in that engine's prefill queue until the first byte.
    prefill_tokens: int = 0
    # Set by a pick that expected the chosen engine's prefix cache to serve part of the prompt
    # (`cache_feedback`): told the answer's bytes, it learns from the engine's cached-token count.
    expected_hit: AnswerUsage | None = None


class AnswerUsage(Protocol):
    def answered(self, body: bytes) -> None:
        """An answer's bytes (a whole body, or a stream's last events), its usage among them or not."""
        ...


class Policy(Protocol):
    """Given the eligible endpoints and a request, pick one: only among the candidates it is handed
    (never an endpoint outside them), never waiting or doing I/O; eligibility is membership's job."""

    name: str

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        """Choose one of `candidates` (never empty)."""
        ...
