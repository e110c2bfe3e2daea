"""Flow control's gate on the data path: a request goes on at once while an eligible engine of its model
has room (corral.router.flow.saturation); otherwise it waits in its model's flow queue
(corral.router.flow.queue) and is let out as room comes back: a request of that model ending here, or,
every `tick_seconds` while anything waits, fresher engine figures or a sibling worker's request ending.

A request leaves the queue only to an engine, when its client hangs up (the server cancels its task:
it is taken out at once), or with a 429 and Retry-After in OpenAI's error shape: a sheddable request
(negative priority) while saturated, the queue or its tenant's share of it full, displaced by a higher
band when the queue is full, or its band's TTL spent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from corral.router.flow.config import FlowConfig
from corral.router.flow.host_flows import HostFlows
from corral.router.flow.queue import FlowQueue, Queued
from corral.router.flow.refusal import Refusal
from corral.router.flow.request_class import RequestClass, TenantFlow, classify
from corral.router.flow.saturation import UNBOUNDED, Saturation
from corral.router.flow.shares import SlotShares
from corral.router.flow.telemetry import FlowStats
from corral.router.membership.endpoint import Endpoint

log = logging.getLogger("corral.router.flow")

Eligible = Callable[[str], Sequence[Endpoint]]


class Admission:
    """A request let on to an engine: at once (`waited` False), or out of the queue (to an engine with
    room); handed back to `FlowGate.finished` when it ends."""

    __slots__ = ("klass", "waited")

    def __init__(self, waited: bool, klass: RequestClass) -> None:
        self.waited = waited
        self.klass = klass


class _Ticket:
    __slots__ = ("future", "klass", "model")

    def __init__(self, future: asyncio.Future[Admission | Refusal], model: str, klass: RequestClass) -> None:
        self.future = future
        self.model = model
        self.klass = klass


class FlowGate:
    def __init__(
        self, config: FlowConfig, saturation: Saturation, eligible: Eligible, host: HostFlows | None = None
    ) -> None:
        self.config = config
        self.saturation = saturation
        self._eligible = eligible
        self.stats = FlowStats()
        self._queues: dict[str, FlowQueue] = {}
        self._pending: dict[str, int] = {}  # let out, not yet at an engine (their tasks not yet resumed)
        self._per_flow: dict[str, int] = {}
        self._total = 0
        self._ticker: asyncio.Task[None] | None = None
        self._shares = (
            SlotShares(config.share_window_seconds, host)
            if config.slot_shares and config.engine_max_in_flight
            else None
        )

    # -- the data path -----------------------------------------------------------------------

    async def admit(
        self, model: str, headers: Mapping[str, str], tenant: TenantFlow | None
    ) -> Admission | Refusal:
        """An Admission when the request may go to an engine; else the 400 (a bad flow header)
        or 429 that answers it. A client that hangs up while waiting raises CancelledError here."""
        now = self.admit_now(model, headers, tenant)
        return now if not isinstance(now, RequestClass) else await self.wait(model, now)

    def admit_now(
        self, model: str, headers: Mapping[str, str], tenant: TenantFlow | None
    ) -> Admission | Refusal | RequestClass:
        """`admit` without an await, what the data path calls on every request: the Admission when an
        engine has room and nothing waits, the Refusal of a bad flow header, or the request's class,
        which then waits (`wait`)."""
        klass = classify(headers, tenant)
        if isinstance(klass, Refusal):
            return klass
        queue = self._queues.get(model)
        if queue is not None and queue.depth:
            return klass
        pending = self._pending.get(model, 0)
        endpoints = self._eligible(model)
        if (
            self.saturation.any_room(endpoints)
            if not pending
            else self.saturation.total_room(endpoints) > pending
        ) and self._claim(model, klass, len(endpoints), time.monotonic()):
            self.stats.passed += 1
            return Admission(False, klass)
        return klass

    def _claim(self, model: str, klass: RequestClass, engines: int, now: float) -> bool:
        """Count the request as started if its flow is within its slot share (flow/shares.py)."""
        shares = self._shares
        if shares is None:
            return True
        if not engines:
            shares.started(model, klass.flow, klass.priority, klass.weight)
            return True
        capacity = self.config.engine_max_in_flight * engines
        return shares.claim(model, klass.flow, klass.priority, klass.weight, capacity, now)

    def with_room(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Where a request let out of the queue goes: the engines with room (all when none has)."""
        return self.saturation.with_room(endpoints) or endpoints

    def finished(self, model: str, admission: Admission | None) -> None:
        """A request of `model` has ended here (`admission`: how it was let on, None if it was not):
        its room may go to one that waits."""
        if admission is not None and self._shares is not None:
            self._shares.ended(model, admission.klass.flow, time.monotonic())
        queue = self._queues.get(model)
        if queue is not None and queue.depth:
            self._let_out(model, queue)

    # -- waiting -----------------------------------------------------------------------------

    async def wait(self, model: str, klass: RequestClass) -> Admission | Refusal:
        """Hold a request `admit_now` could not let on (its class) until it goes to an engine or is
        refused; a client that hangs up while waiting raises CancelledError here."""
        key = (klass.priority, klass.tenant)
        config = self.config
        if klass.sheddable:
            return self._shed(key, "saturated", f"model `{model}` is saturated and this request is sheddable")
        if self._per_flow.get(klass.flow, 0) >= config.max_queue_per_flow:
            return self._shed(
                key,
                "flow_full",
                f"{config.max_queue_per_flow} requests of this flow already wait for `{model}`",
            )
        if self._total >= config.max_queue and not self._displace(klass.priority):
            return self._shed(key, "queue_full", f"the router's flow queue is full ({config.max_queue})")
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = FlowQueue(config.order)
        now = time.monotonic()
        deadline = now + klass.deadline_ms / 1000 if klass.deadline_ms is not None else float("inf")
        future: asyncio.Future[Admission | Refusal] = asyncio.get_running_loop().create_future()
        item = Queued(
            priority=klass.priority,
            flow=klass.flow,
            weight=klass.weight,
            enqueued=now,
            expires=now + config.ttl(klass.priority),
            deadline=deadline,
            tenant=klass.tenant,
            waiter=_Ticket(future, model, klass),
        )
        queue.push(item)
        self._entered(item)
        self._let_out(model, queue)
        if not future.done():
            self._tick_soon()
        try:
            outcome = await future
        except asyncio.CancelledError:
            if queue.remove(item):  # the client hung up while it waited
                self._left(item)
                self.stats.count_gone(key)
            elif not future.cancelled() and isinstance(let_out := future.result(), Admission):
                self._pending[model] -= 1  # let out, then gone: its room goes on
                self.finished(model, let_out)
            raise
        if isinstance(outcome, Admission):
            # the caller reaches an engine without another await: from here its in-flight count says it
            self._pending[model] -= 1
        return outcome

    def _let_out(self, model: str, queue: FlowQueue) -> None:
        pending = self._pending.get(model, 0)
        endpoints = self._eligible(model)
        room = self.saturation.total_room(endpoints) - pending
        now = time.monotonic()
        shares, engines = self._shares, len(endpoints)
        claim = None
        if shares is not None and engines:
            capacity = self.config.engine_max_in_flight * engines

            def claim(item: Queued) -> bool:  # the item `pop` returns is the one claimed
                return shares.claim(model, item.flow, item.priority, item.weight, capacity, now)

        while room > 0 and queue.depth:
            item = queue.pop(claim)
            if item is None:
                break
            self._left(item)
            if shares is not None and claim is None:
                shares.started(model, item.flow, item.priority, item.weight)
            if self._client_gone(item):
                if shares is not None:
                    shares.release(model, item.flow)
                continue
            self.stats.let_out((item.priority, item.tenant), now - item.enqueued)
            pending += 1
            room -= 1
            item.waiter.future.set_result(Admission(True, item.waiter.klass))
        self._pending[model] = pending

    def _displace(self, priority: int) -> bool:
        """Make room in a full queue for a request of `priority` by shedding the newest request of a
        lower band; False when every waiting request's band is as high."""
        victim: Queued | None = None
        for queue in self._queues.values():
            lowest = queue.lowest()
            if lowest is not None and lowest.priority < priority:
                if victim is None or (lowest.priority, -lowest.enqueued) < (
                    victim.priority,
                    -victim.enqueued,
                ):
                    victim = lowest
        if victim is None:
            return False
        self._queues[victim.waiter.model].remove(victim)
        self._left(victim)
        if self._client_gone(victim):
            return True
        victim.waiter.future.set_result(
            self._shed(
                (victim.priority, victim.tenant),
                "displaced",
                "the router's flow queue was full and a request of a higher priority took this one's place",
            )
        )
        return True

    def _client_gone(self, item: Queued) -> bool:
        """Whether the request's client hung up: its task is cancelled (and so its future, at once),
        but its handler has not run yet to take it out; counted here, answered by no one."""
        if not item.waiter.future.cancelled():
            return False
        self.stats.count_gone((item.priority, item.tenant))
        return True

    def _shed(self, key: tuple[int, str], reason: str, why: str) -> Refusal:
        self.stats.count_shed(key, reason)
        seconds = self.config.retry_after_seconds
        return Refusal(
            429,
            f"The router is holding requests back: {why}; retry after {seconds} s.",
            "rate_limit_error",
            retry_after=seconds,
        )

    def _entered(self, item: Queued) -> None:
        if self._shares is not None:
            self._shares.waiting(item.waiter.model, item.flow, item.priority, item.weight, 1)
        self._total += 1
        self._per_flow[item.flow] = self._per_flow.get(item.flow, 0) + 1
        self.stats.entered((item.priority, item.tenant))

    def _left(self, item: Queued) -> None:
        if self._shares is not None:
            self._shares.waiting(item.waiter.model, item.flow, item.priority, item.weight, -1)
        self._total -= 1
        left = self._per_flow[item.flow] - 1
        if left:
            self._per_flow[item.flow] = left
        else:
            del self._per_flow[item.flow]
        self.stats.left((item.priority, item.tenant))

    # -- the tick: expiries, fresher figures, sibling workers' requests ending ------------------

    def _tick_soon(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="corral-flow-tick")

    async def _tick(self) -> None:
        while self._total:
            await asyncio.sleep(self.config.tick_seconds)
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        for model, queue in list(self._queues.items()):
            for item in list(queue.expired(now)):
                queue.remove(item)
                self._left(item)
                if self._client_gone(item):
                    continue
                ttl = self.config.ttl(item.priority)
                item.waiter.future.set_result(
                    self._shed(
                        (item.priority, item.tenant),
                        "ttl",
                        f"this request waited {ttl:g} s (its priority band's queue TTL) while every engine "
                        f"of model `{model}` was saturated",
                    )
                )
            if queue.depth:
                self._let_out(model, queue)
            elif not self._pending.get(model):
                del self._queues[model]
                self._pending.pop(model, None)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()

    # -- reading -----------------------------------------------------------------------------

    def oldest_age(self) -> float | None:
        now = time.monotonic()
        ages = [now - item.enqueued for q in self._queues.values() if (item := q.oldest()) is not None]
        return max(ages) if ages else None

    def to_json(self) -> dict[str, object]:
        config = self.config
        return {
            **self.stats.to_json(self.oldest_age()),
            "settings": {
                "engine_max_in_flight": config.engine_max_in_flight or None,
                "max_waiting": config.max_waiting,
                "max_kv_usage": config.max_kv_usage,
                "ttl_seconds": config.ttl_seconds,
                "band_ttl_seconds": {str(b): s for b, s in config.band_ttl_seconds.items()},
                "max_queue": config.max_queue,
                "max_queue_per_flow": config.max_queue_per_flow,
                "order": config.order,
            },
        }


__all__ = ["UNBOUNDED", "Admission", "FlowGate"]
