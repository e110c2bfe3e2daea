"""Slow start: an endpoint that has just become routable (first READY, READY again after a wake or a
restart, its serving group whole again, back from an ejection) takes a share of traffic that ramps
from `FLOOR` of its full share to all of it over S seconds, whatever policy picks.

The ramp is a cap, not a nudge: while it warms, an endpoint earns `w(t) / n` of a request on every
pick among n candidates it is one of, `w(t) = FLOOR + (1 - FLOOR) * min(1, elapsed / S)`, and it is
offered to the policy only while it has taken fewer requests than it earned (at most one unused
request of credit). So its share is at most `w(t)` times the mean share, even under a policy that
prefers it because it is idle (least request, the load scorers), where a probability or a score bias
would let the policy herd onto it. Weights are relative to the oldest candidate's, and a candidate
whose relative weight is 1 (the oldest, and every one that became routable with it) is never capped:
endpoints that became routable together (a whole fleet coming up) share alike, and the pool never
empties, since the oldest candidate is always offered. Endpoints already routable in the router's
first `BOOT_SECONDS` (its first discovery and probe round: a router starting or restarting in front of
a serving fleet) are warm from the start: they neither ramp themselves nor ramp against a newcomer,
which then starts at `FLOOR` of its share. Affinity follows: a warming prefix or session home is
skipped while it is over its cap, and the key goes where the ring sends it next (the prefix memory
then remembers the key there). Cost on the hot path outside ramps: one attribute read and two
compares per candidate; while one ramps, a few float operations per warming candidate and a new
candidate list.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from corral.router.membership.eligible import EligibleSet
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.request import Policy, RouteRequest

# A returning engine starts at a tenth of its share: enough requests to show it serves (and to warm
# CUDA graphs, allocator and prefix cache), few enough that a slow first minute hurts few clients.
FLOOR = 0.1
# What a router finds routable this soon after it starts was serving before it: its first listing and
# probe round take well under this (a probe answers in milliseconds; a supervisor stream's first line
# comes on connect), and an engine that turns READY later (loading, waking) ramps as it should.
BOOT_SECONDS = 2.0


class SlowStartError(ValueError):
    pass


def warmup_weight(elapsed: float, seconds: float, floor: float = FLOOR) -> float:
    """The share of its full share an endpoint routable for `elapsed` seconds may take: `floor` at 0,
    rising linearly to 1 at `seconds` (1 at once when `seconds` is 0: slow start off)."""
    if seconds <= 0 or elapsed >= seconds:
        return 1.0
    return floor + (1.0 - floor) * max(0.0, elapsed) / seconds


def check_seconds(seconds: float, what: str) -> float:
    if not seconds >= 0 or seconds == float("inf"):
        raise SlowStartError(f"{what} {seconds!r}: give the ramp in seconds, >= 0 (0 turns slow start off)")
    return float(seconds)


class SlowStart:
    """A `Policy` that hands `policy` only the candidates under their slow-start cap.

    `seconds` is the ramp for models not in `by_model`; 0 turns it off (the policy sees every
    candidate, at the cost of one dict lookup)."""

    def __init__(
        self,
        policy: Policy,
        seconds: float,
        by_model: Mapping[str, float] | None = None,
        *,
        floor: float = FLOOR,
        clock: Callable[[], float] = time.monotonic,
        boot_seconds: float = BOOT_SECONDS,
    ) -> None:
        self.policy = policy
        self.name = policy.name
        self.seconds = check_seconds(seconds, "--slow-start-seconds")
        self.by_model = {
            model: check_seconds(s, f"slow_start_models.{model}") for model, s in (by_model or {}).items()
        }
        if not 0 < floor <= 1:
            raise SlowStartError(f"slow start floor {floor!r}: give a share in (0, 1]")
        self.floor = floor
        self._clock = clock
        # routable by then: present when the router started (0: no such grace)
        self._warm_until = clock() + boot_seconds if boot_seconds > 0 else -math.inf
        self.enabled = self.seconds > 0 or any(s > 0 for s in self.by_model.values())

    def seconds_for(self, model: str) -> float:
        return self.by_model.get(model, self.seconds)

    def pick(self, candidates: Sequence[Endpoint], request: RouteRequest) -> Endpoint:
        seconds = self.by_model.get(request.model, self.seconds)
        n = len(candidates)
        if seconds <= 0 or n == 1:
            return self.policy.pick(candidates, request)
        now = self._clock()
        horizon = max(now - seconds, self._warm_until)  # routable from then or earlier: warm
        if isinstance(candidates, EligibleSet) and candidates.newest_start <= horizon:
            return self.policy.pick(candidates, request)  # membership's set knows: O(1), not a scan
        oldest = newest = candidates[0].routable_from
        for e in candidates:
            start = e.routable_from
            if start < oldest:
                oldest = start
            elif start > newest:
                newest = start
        if newest <= horizon:  # nobody ramps: the common case
            return self.policy.pick(candidates, request)
        floor, rise = self.floor, (1.0 - self.floor) / seconds
        # Weights relative to the oldest candidate's: endpoints that became routable together (a
        # router starting, a cold fleet) share alike; a newcomer among warm peers starts at `floor`.
        ref = 1.0 if oldest <= horizon else floor + rise * max(0.0, now - oldest)
        offered: list[Endpoint] = []
        admitted: list[Endpoint] = []
        for e in candidates:
            start = e.routable_from
            if start <= horizon:
                offered.append(e)
                continue
            w = (floor + rise * max(0.0, now - start)) / ref
            if w >= 1.0:  # as warm as the oldest candidate (it, or routable with it): no cap
                offered.append(e)
                continue
            if e.ramp_start != start:  # a new ramp: routable again since the last one
                e.ramp_start, e.ramp_taken, e.ramp_earned = start, 0, 0.0
            e.ramp_earned = min(e.ramp_earned + w / n, e.ramp_taken + 1.0)
            if e.ramp_taken < e.ramp_earned:
                offered.append(e)
                admitted.append(e)
        if not offered:  # cannot happen (the oldest is always offered); never leave the pool empty
            return self.policy.pick(candidates, request)
        chosen = self.policy.pick(offered if len(offered) < n else candidates, request)
        if chosen in admitted:
            chosen.ramp_taken += 1
        return chosen

    def weight(self, endpoint: Endpoint, now: float | None = None) -> float:
        """The endpoint's ramp weight now, by the longest ramp of the models it serves."""
        seconds = max((self.seconds_for(m) for m in endpoint.models), default=self.seconds)
        now = self._clock() if now is None else now
        if endpoint.routable_from <= self._warm_until:
            return 1.0  # present when the router started
        return warmup_weight(now - endpoint.routable_from, seconds, self.floor)

    def to_json(self, endpoint: Endpoint, now: float | None = None) -> dict[str, Any] | None:
        """`/v1/fleet`'s `slow_start` of an endpoint: when its ramp began (wall clock) and its weight
        now; None when slow start is off."""
        if not self.enabled:
            return None
        now = self._clock() if now is None else now
        return {
            "since": round(time.time() - (now - endpoint.routable_from), 3),
            "weight": round(self.weight(endpoint, now), 4),
            "taken": endpoint.ramp_taken if endpoint.ramp_start == endpoint.routable_from else 0,
        }

    def weights(self, endpoints: Iterable[Endpoint]) -> list[tuple[Endpoint, float]]:
        now = self._clock()
        return [(e, self.weight(e, now)) for e in endpoints]
