"""Slot shares (`--flow-slot-shares`): while several tenants of a band are active, each may hold at most its
weighted share of the model's engine slots (`--flow-engine-max-in-flight` x its eligible engines, less
what higher bands hold), so that a slot is free when a light tenant's request comes instead of every slot
going to whoever floods. A tenant is active while it has a request in flight or waiting, and for
`window` seconds after its last one ended. Not work-conserving across tenants: a flood waits while the
slots it may not take stay free for the others' next requests; alone, a tenant may use every slot.

With `--workers N` the counts are the host's (`host`, corral.router.flow.host_flows): each worker
publishes its own flows' counts and adds its siblings' when it judges a share, so a flow is held to its
share of the host's slots whichever workers its requests reach."""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.flow.host_flows import HostFlows, SiblingFlow

_NONE = (0, 0, 0, False)  # what no sibling adds


class _Use:
    __slots__ = ("idle_since", "in_flight", "priority", "waiting", "weight")

    def __init__(self, priority: int, weight: int) -> None:
        self.priority = priority
        self.weight = weight
        self.in_flight = 0
        self.waiting = 0
        self.idle_since = 0.0


class SlotShares:
    def __init__(self, window: float, host: HostFlows | None = None) -> None:
        self.window = window
        self.host = host  # the sibling workers' counts (None: this process is the host's router)
        self._models: dict[str, dict[str, _Use]] = {}

    def _use(self, model: str, flow: str, priority: int, weight: int) -> _Use:
        flows = self._models.get(model)
        if flows is None:
            flows = self._models[model] = {}
        use = flows.get(flow)
        if use is None:
            use = flows[flow] = _Use(priority, weight)
        else:
            use.priority, use.weight = priority, weight
        return use

    def started(self, model: str, flow: str, priority: int, weight: int) -> None:
        use = self._use(model, flow, priority, weight)
        use.in_flight += 1
        if self.host is not None:
            self.host.publish(model, flow, use)

    def ended(self, model: str, flow: str, now: float) -> None:
        use = self._models.get(model, {}).get(flow)
        if use is not None:
            use.in_flight -= 1
            use.idle_since = now
            if self.host is not None:
                self.host.publish(model, flow, use)

    def claim(self, model: str, flow: str, priority: int, weight: int, capacity: int, now: float) -> bool:
        """Start one more request of `flow` if it is within its share (`allows`); False, and nothing
        counted, when it is not. Counted (and published to the siblings) before it is judged, so two
        workers deciding at once each see the other's request: both may wait, rather than both start."""
        if self.host is None:
            flows = self._models.get(model)
            if flows is not None and len(flows) == 1:
                use = flows.get(flow)
                if use is not None and use.priority == priority:  # alone: nobody's share to keep
                    use.weight = weight
                    use.in_flight += 1
                    return True
        use = self._use(model, flow, priority, weight)
        use.in_flight += 1
        if self.host is not None:
            self.host.publish(model, flow, use)
        if self.allows(model, flow, priority, weight, capacity, now, claimed=1):
            return True
        self.release(model, flow)
        return False

    def release(self, model: str, flow: str) -> None:
        """A claimed request that never went on (its client left first)."""
        use = self._models.get(model, {}).get(flow)
        if use is not None:
            use.in_flight -= 1
            if self.host is not None:
                self.host.publish(model, flow, use)

    def waiting(self, model: str, flow: str, priority: int, weight: int, change: int) -> None:
        use = self._use(model, flow, priority, weight)
        use.waiting += change
        if self.host is not None:
            self.host.publish(model, flow, use)

    def allows(
        self, model: str, flow: str, priority: int, weight: int, capacity: int, now: float, claimed: int = 0
    ) -> bool:
        """Whether `flow` may start one more request now (`claimed`: already counted): under its share,
        or alone in its band."""
        flows = self._models.get(model)
        host = self.host
        siblings = host.siblings(model, now) if host is not None else ()
        if not flows and not siblings:
            return True
        if flows is None:
            flows = {}
        me = flows.get(flow)
        held = me.in_flight if me is not None else 0
        higher = 0
        weights = weight
        others = False
        stale: list[str] = []
        band: list[str] = []  # this worker's other active flows of the band
        for name, use in flows.items():
            active = use.in_flight or use.waiting or now - use.idle_since < self.window
            if not active:
                stale.append(name)
            elif use.priority > priority:
                higher += use.in_flight
            elif use.priority == priority and name != flow:
                weights += use.weight
                others = True
                band.append(name)
        for name in stale:
            if name != flow:
                del flows[name]
                if host is not None:
                    host.forget(model, name)
        if host is not None:
            counted = self._siblings(host, siblings, flow, priority, band, now) if siblings else _NONE
            if (others or counted[3] or higher or counted[1]) and not host.read_at(now):
                # a share binds: judge it on the siblings' counts now, not those of a moment ago
                counted = self._siblings(host, host.siblings(model, now, True), flow, priority, band, now)
            held += counted[0]
            higher += counted[1]
            weights += counted[2]
            others = others or counted[3]
        if not others and not higher:
            return True
        share = (capacity - higher) * weight / weights
        return held - claimed < max(1.0, share)

    def _siblings(
        self,
        host: HostFlows,
        siblings: Sequence[SiblingFlow],
        flow: str,
        priority: int,
        band: list[str],
        now: float,
    ) -> tuple[int, int, int, bool]:
        """What the siblings add: to `flow`'s held requests, to the higher bands' requests, to the
        band's weights (each flow's once: `band` are this worker's own), and whether the band has
        another active flow."""
        mine = host.key(flow)
        counted = {mine, *(host.key(name) for name in band)}
        window = self.window
        held = higher = weights = 0
        others = False
        for sibling in siblings:
            if not (sibling.in_flight or sibling.waiting or now - sibling.idle_since < window):
                continue
            if sibling.flow == mine:
                held += sibling.in_flight
            elif sibling.priority > priority:
                higher += sibling.in_flight
            elif sibling.priority == priority:
                others = True
                if sibling.flow not in counted:
                    counted.add(sibling.flow)
                    weights += sibling.weight
        return held, higher, weights, others
