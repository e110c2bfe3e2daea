"""Slot shares (`--flow-slot-shares`): while several tenants of a band are active, each may hold at most its
weighted share of the model's engine slots (`--flow-engine-max-in-flight` x its eligible engines, less
what higher bands hold), so that a slot is free when a light tenant's request comes instead of every slot
going to whoever floods. A tenant is active while it has a request in flight or waiting, and for
`window` seconds after its last one ended. Not work-conserving across tenants: a flood waits while the
slots it may not take stay free for the others' next requests; alone, a tenant may use every slot.

Counts are this router process's: with `--workers N` each worker counts its own requests and shares out
1/N of the host's slots among the tenants it sees together; a tenant alone in a worker is not held by
shares there (the engines' in-flight bound, host-wide, still holds)."""

from __future__ import annotations


class _Use:
    __slots__ = ("idle_since", "in_flight", "priority", "waiting", "weight")

    def __init__(self, priority: int, weight: int) -> None:
        self.priority = priority
        self.weight = weight
        self.in_flight = 0
        self.waiting = 0
        self.idle_since = 0.0


class SlotShares:
    def __init__(self, window: float) -> None:
        self.window = window
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
        self._use(model, flow, priority, weight).in_flight += 1

    def ended(self, model: str, flow: str, now: float) -> None:
        use = self._models.get(model, {}).get(flow)
        if use is not None:
            use.in_flight -= 1
            use.idle_since = now

    def waiting(self, model: str, flow: str, priority: int, weight: int, change: int) -> None:
        self._use(model, flow, priority, weight).waiting += change

    def allows(self, model: str, flow: str, priority: int, weight: int, capacity: int, now: float) -> bool:
        """Whether `flow` may start one more request now: under its share, or alone in its band."""
        flows = self._models.get(model)
        if not flows:
            return True
        me = flows.get(flow)
        held = me.in_flight if me is not None else 0
        higher = 0
        weights = weight
        others = False
        stale: list[str] = []
        for name, use in flows.items():
            active = use.in_flight or use.waiting or now - use.idle_since < self.window
            if not active:
                stale.append(name)
            elif use.priority > priority:
                higher += use.in_flight
            elif use.priority == priority and name != flow:
                weights += use.weight
                others = True
        for name in stale:
            if name != flow:
                del flows[name]
        if not others and not higher:
            return True
        share = (capacity - higher) * weight / weights
        return held < max(1.0, share)
