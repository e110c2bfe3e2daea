"""Flow control's gate (corral.router.flow.gate) over real endpoints and tenants: a request goes on while an
engine has room, else waits; waiting requests go out by band, by weighted share, as room frees; the
bounds (sheddable while saturated, queue and tenant bounds, displacement, TTL) answer 429 + Retry-After;
a client that hangs up leaves the queue at once; every request is accounted for."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from corral.engine_state import EngineState
from corral.router.edge.tenants import Tenant
from corral.router.edge.tenants_file import TenantSpec
from corral.router.flow.config import FlowConfig
from corral.router.flow.gate import Admission, FlowGate
from corral.router.flow.host_flows import HostFlows, HostFlowTables
from corral.router.flow.refusal import Refusal
from corral.router.flow.saturation import Saturation
from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import EngineLoad, LoadBoard
from corral.router.routing.worker_journal import WorkerJournals


def tenant(name: str, **fields: object) -> Tenant:
    return Tenant(TenantSpec(name=name, **fields))  # type: ignore[arg-type]


class Fleet:
    """Engines of one model, each taking `slots` requests before it is saturated."""

    def __init__(
        self,
        engines: int = 1,
        slots: int = 1,
        board: LoadBoard | None = None,
        host: HostFlows | None = None,
        **config: object,
    ) -> None:
        self.endpoints = [
            Endpoint(f"http://10.0.0.{i}:8000", frozenset({"m"}), EngineState.READY) for i in range(engines)
        ]
        self.config = FlowConfig(engine_max_in_flight=slots, **config)  # type: ignore[arg-type]
        self.host = host  # this worker's side of the host's counts (`--workers N`)
        self.gate = FlowGate(self.config, Saturation(self.config, board), lambda model: self.endpoints, host)
        self.order: list[str] = []
        self.running: list[Admission] = []

    async def request(
        self, who: Tenant | None, headers: dict[str, str] | None = None, label: str = ""
    ) -> Admission | Refusal:
        """Ask the gate; once let on, hold a slot (as the proxy's Dispatch does) until `end`."""
        got = await self.gate.admit("m", headers or {}, who)
        if isinstance(got, Admission):
            engine = min(self.endpoints, key=lambda e: e.in_flight)
            engine.in_flight += 1
            self.running.append(got)
            self.order.append(label or (who.name if who else "-"))
        return got

    def end(self) -> None:
        engine = max(self.endpoints, key=lambda e: e.in_flight)
        engine.in_flight -= 1
        self.gate.finished("m", self.running.pop(0))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def at_once(got: object) -> bool:
    return isinstance(got, Admission) and not got.waited


def let_out(got: object) -> bool:
    return isinstance(got, Admission) and got.waited


def status(answer: object) -> int:
    assert isinstance(answer, Refusal), answer
    return answer.status


async def test_goes_on_at_once_while_an_engine_has_room() -> None:
    fleet = Fleet(engines=2, slots=1)
    assert at_once(await fleet.request(None))
    assert at_once(await fleet.request(None))
    assert fleet.gate.stats.passed == 2 and fleet.gate.to_json()["depth"] == 0


async def test_waits_while_saturated_and_goes_when_a_request_ends() -> None:
    fleet = Fleet()
    await fleet.request(None)
    waiting = asyncio.create_task(fleet.request(None))
    await settle()
    assert not waiting.done() and fleet.gate.to_json()["depth"] == 1
    fleet.end()
    assert let_out(await waiting)
    assert fleet.gate.stats.dispatched == {(0, ""): 1}


async def test_light_tenant_goes_ahead_of_a_flood_and_weights_set_shares() -> None:
    fleet = Fleet()
    heavy, light, big = tenant("heavy"), tenant("light"), tenant("big", weight=3)
    await fleet.request(heavy)
    tasks = [asyncio.create_task(fleet.request(heavy)) for _ in range(20)]
    tasks += [asyncio.create_task(fleet.request(big)) for _ in range(20)]
    await settle()
    tasks.append(asyncio.create_task(fleet.request(light)))
    await settle()
    for _ in range(17):
        fleet.end()
        await settle()
    served = fleet.order[1:]
    assert "light" in served[:3]  # not behind the 40 already waiting
    shares = Counter(served[:16])
    assert shares["big"] >= 2.5 * shares["heavy"] - 1  # weight 3 against 1 while both wait
    for t in tasks:
        t.cancel()


async def test_higher_priority_overtakes_and_sheddable_is_refused_first() -> None:
    fleet = Fleet()
    low, high, batch = tenant("low"), tenant("high", priority=10), tenant("batch", priority=-1)
    await fleet.request(low)
    queued_low = asyncio.create_task(fleet.request(low))
    await settle()
    queued_high = asyncio.create_task(fleet.request(high))
    await settle()
    shed = await fleet.request(batch)
    assert status(shed) == 429
    assert isinstance(shed, Refusal) and shed.headers() == {"Retry-After": "2"}
    assert shed.err_type == "rate_limit_error"
    fleet.end()
    assert let_out(await queued_high) and not queued_low.done()
    fleet.end()
    assert let_out(await queued_low)
    assert fleet.gate.stats.shed == {(-1, "batch", "saturated"): 1}


async def test_priority_header_only_up_to_the_tenants_max() -> None:
    fleet = Fleet(slots=100)
    plain, trusted = tenant("plain"), tenant("trusted", max_priority=5)
    assert status(await fleet.request(plain, {"x-corral-priority": "1"})) == 400
    assert at_once(await fleet.request(trusted, {"x-corral-priority": "5"}))
    assert at_once(await fleet.request(trusted, {"x-corral-priority": "-3"}))
    too_high = await fleet.request(trusted, {"x-corral-priority": "6"})
    assert status(too_high) == 400 and "max_priority 5" in too_high.message  # type: ignore[union-attr]
    assert status(await fleet.request(None, {"x-corral-priority": "1"})) == 400  # an open router


@pytest.mark.parametrize(
    "header,value",
    [
        ("x-corral-priority", "9" * 5000),
        ("x-corral-priority", "1e3"),
        ("x-corral-priority", "1001"),
        ("x-corral-priority", ""),
        ("x-corral-deadline-ms", "9" * 5000),
        ("x-corral-deadline-ms", "0"),
        ("x-corral-deadline-ms", "-5"),
        ("x-corral-deadline-ms", "1.5"),
        ("x-corral-fairness-id", "a" * 65),
        ("x-corral-fairness-id", "a b"),
    ],
)
async def test_hostile_flow_headers_are_400_naming_the_header(header: str, value: str) -> None:
    fleet = Fleet(slots=100)
    who = tenant("t", max_priority=1000) if header != "x-corral-fairness-id" else None
    answer = await fleet.request(who, {header: value})
    assert status(answer) == 400
    assert isinstance(answer, Refusal)
    assert answer.param == header
    assert len(value) < 10 or value[:20] not in answer.message  # never echoed at length


async def test_earliest_deadline_first_within_a_tenant() -> None:
    fleet = Fleet(order="edf")
    t = tenant("t")
    await fleet.request(t)
    late = asyncio.create_task(fleet.request(t, {"x-corral-deadline-ms": "9000"}, "late"))
    await settle()
    soon = asyncio.create_task(fleet.request(t, {"x-corral-deadline-ms": "100"}, "soon"))
    await settle()
    fleet.end()
    await settle()
    fleet.end()
    await asyncio.gather(late, soon)
    assert fleet.order[1:] == ["soon", "late"]


async def test_ttl_expiry_is_429_with_retry_after() -> None:
    fleet = Fleet(ttl_seconds=0.05, tick_seconds=0.01)
    await fleet.request(None)
    answer = await fleet.request(None)
    assert status(answer) == 429 and "queue TTL" in answer.message  # type: ignore[union-attr]
    assert fleet.gate.stats.shed == {(0, "", "ttl"): 1} and fleet.gate.to_json()["depth"] == 0


async def test_band_ttl_overrides_the_default() -> None:
    fleet = Fleet(ttl_seconds=60.0, band_ttl_seconds={-0: 0.02}, tick_seconds=0.01)
    await fleet.request(None)
    assert status(await fleet.request(None)) == 429


async def test_a_client_that_hangs_up_leaves_the_queue_at_once() -> None:
    fleet = Fleet()
    await fleet.request(None)
    waiting = asyncio.create_task(fleet.request(None))
    behind = asyncio.create_task(fleet.request(None, label="behind"))
    await settle()
    waiting.cancel()
    await settle()
    assert fleet.gate.to_json()["depth"] == 1 and fleet.gate.stats.gone == {(0, ""): 1}
    fleet.end()
    assert let_out(await behind)  # the room went to the one still there


async def test_let_out_then_gone_passes_its_room_on() -> None:
    fleet = Fleet()
    await fleet.request(None)
    first = asyncio.create_task(fleet.request(None))
    second = asyncio.create_task(fleet.request(None))
    await settle()
    fleet.end()  # lets `first` out; it hangs up before it resumes
    first.cancel()
    assert let_out(await second)


async def test_bounds_total_per_tenant_and_displacement() -> None:
    fleet = Fleet(max_queue=3, max_queue_per_flow=2)
    a, b, vip = tenant("a"), tenant("b"), tenant("vip", priority=5)
    await fleet.request(a)
    waiting = [asyncio.create_task(fleet.request(a)) for _ in range(2)]
    await settle()
    assert status(await fleet.request(a)) == 429  # a's own bound
    waiting.append(asyncio.create_task(fleet.request(b)))
    await settle()
    full = await fleet.request(b)
    assert status(full) == 429 and "full" in full.message  # type: ignore[union-attr]
    vip_task = asyncio.create_task(fleet.request(vip))
    await settle()
    # the newest of the lowest band made room for it
    displaced = waiting[-1]
    assert displaced.done() and status(displaced.result()) == 429
    reasons = Counter(r for (_, _, r) in fleet.gate.stats.shed)
    assert reasons == {"flow_full": 1, "queue_full": 1, "displaced": 1}
    fleet.end()
    assert let_out(await vip_task)
    for t in waiting:
        t.cancel()


async def test_engine_figures_saturate_until_a_request_ends_or_fresher_figures() -> None:
    board = LoadBoard(stale_after=60.0)
    fleet = Fleet(slots=0, board=board, max_waiting=1)
    engine = fleet.endpoints[0]
    engine.in_flight = 3
    loop = asyncio.get_running_loop()
    board.loads[engine.url] = EngineLoad(running=3, waiting=2, at=loop.time())
    waiting = asyncio.create_task(fleet.request(None))
    await settle()
    assert not waiting.done()
    engine.in_flight -= 1  # one of the three it had when scraped ended: one goes on
    fleet.gate.finished("m", None)
    assert let_out(await waiting)
    held = asyncio.create_task(fleet.request(None))
    await settle()
    assert not held.done()
    board.loads[engine.url] = EngineLoad(running=3, waiting=0, at=loop.time() + 1)  # fresher: room
    fleet.gate.tick(loop.time())
    assert let_out(await held)


async def test_no_eligible_engine_is_not_held() -> None:
    fleet = Fleet()
    await fleet.request(None)
    waiting = asyncio.create_task(fleet.gate.admit("m", {}, None))
    await settle()
    fleet.endpoints.clear()  # the engine left: what waited goes on to the proxy's 503 (or a wake)
    fleet.gate.tick(asyncio.get_running_loop().time())
    assert let_out(await waiting)
    assert at_once(await fleet.gate.admit("m", {}, None))


async def test_slot_shares_keep_a_flood_to_its_share_while_another_tenant_is_active() -> None:
    fleet = Fleet(engines=2, slots=4, share_window_seconds=60.0)
    heavy, light = tenant("heavy"), tenant("light")
    await fleet.request(light)  # light is active: one in flight
    flood = [asyncio.create_task(fleet.request(heavy)) for _ in range(8)]
    await settle()
    # 8 slots, two tenants of weight 1: heavy holds 4 and waits with slots free for light
    assert fleet.order.count("heavy") == 4 and sum(e.in_flight for e in fleet.endpoints) == 5
    for _ in range(2):  # behind the waiting flood in the queue, and let out at once past it
        got = asyncio.create_task(fleet.request(light))
        await settle()
        assert got.done() and let_out(got.result())
    assert fleet.order.count("heavy") == 4
    for t in flood:
        t.cancel()


async def test_slot_shares_let_a_lone_tenant_use_every_slot_and_can_be_turned_off() -> None:
    alone = Fleet(engines=2, slots=4)
    for _ in range(8):
        assert at_once(await alone.request(tenant("heavy")))
    off = Fleet(engines=2, slots=4, slot_shares=False)
    await off.request(tenant("light"))
    for _ in range(7):
        assert at_once(await off.request(tenant("heavy")))  # work-conserving: every free slot


async def test_a_flood_that_took_every_slot_alone_is_held_to_its_share_once_another_tenant_comes() -> None:
    """Alone, a tenant's requests take the fast path (no share to judge); the first request of another
    tenant ends that: from then on the flood gets no slot past its share."""
    fleet = Fleet(engines=2, slots=4, share_window_seconds=60.0)
    heavy, light = tenant("heavy"), tenant("light")
    for _ in range(8):
        assert at_once(await fleet.request(heavy))
    light_waits = asyncio.create_task(fleet.request(light))
    heavy_waits = [asyncio.create_task(fleet.request(heavy)) for _ in range(4)]
    await settle()
    assert not light_waits.done()
    for _ in range(4):  # heavy's requests end, one by one: the first slot goes to light, the rest stay free
        fleet.end()
        await settle()
    assert light_waits.done() and let_out(light_waits.result())
    assert fleet.order.count("heavy") == 8 and not any(t.done() for t in heavy_waits)
    assert sum(e.in_flight for e in fleet.endpoints) == 5  # heavy at its share of 4, light 1
    for t in heavy_waits:
        t.cancel()


async def test_slot_shares_do_not_hold_back_a_higher_band() -> None:
    fleet = Fleet(engines=2, slots=4, share_window_seconds=60.0)
    await fleet.request(tenant("low"))
    for _ in range(7):
        assert at_once(await fleet.request(tenant("high", priority=10)))


def two_workers(one_host: bool = True) -> tuple[Fleet, Fleet]:
    """The gates of `--workers 2`, each over its side of one shared region (as after the fork), in front
    of the host's engines (`one_host`: each worker reads the host's in-flight counts) or each of its own."""
    tables = HostFlowTables(WorkerJournals(2))
    one, two = (
        Fleet(engines=2, slots=4, share_window_seconds=60.0, host=HostFlows(tables, i, 60.0, refresh=0.0))
        for i in (1, 2)
    )
    if one_host:
        two.endpoints = one.endpoints
    return one, two


async def test_with_workers_a_flood_alone_in_its_worker_is_held_to_its_share_of_the_host() -> None:
    w1, w2 = two_workers()
    await w2.request(tenant("light"))  # the light tenant's only request reached the other worker
    flood = [asyncio.create_task(w1.request(tenant("heavy"))) for _ in range(7)]
    await settle()
    assert w1.order.count("heavy") == 4  # half the host's 8 slots, not all 7 free ones
    w2.end()  # the light tenant's request ends: it stays active for the window, its share kept free
    assert w1.order.count("heavy") == 4
    for t in flood:
        t.cancel()


async def test_with_workers_a_flood_over_every_worker_is_counted_as_one_flow() -> None:
    w1, w2 = two_workers()
    await w2.request(tenant("light"))
    for _ in range(3):
        assert at_once(await w1.request(tenant("heavy")))
    flood = [asyncio.create_task(w2.request(tenant("heavy"))) for _ in range(3)]
    await settle()
    assert w2.order.count("heavy") == 1  # 3 in worker 1 + 1 here: its 4 of the host's 8
    for t in flood:
        t.cancel()


async def test_a_dead_workers_flows_hold_no_one_back() -> None:
    w1, w2 = two_workers(one_host=False)
    await w1.request(tenant("light"))  # worker 1's light tenant is active ...
    flood = [asyncio.create_task(w2.request(tenant("heavy"))) for _ in range(8)]
    await settle()
    assert w2.order.count("heavy") == 4
    assert w2.host is not None
    w2.host.tables.journals.new_incarnation(1)  # ... until worker 1 dies: the parent bumps its incarnation
    w2.end()  # room here: the heavy tenant is alone on the host now and may take every slot
    await settle()
    assert w2.order.count("heavy") == 8
    for t in flood:
        t.cancel()


async def test_a_hang_up_not_yet_handled_is_skipped_when_room_comes() -> None:
    fleet = Fleet()
    await fleet.request(None)
    gone = asyncio.create_task(fleet.request(None))
    behind = asyncio.create_task(fleet.request(None, label="behind"))
    await settle()
    gone.cancel()  # its future is cancelled now; its handler runs in a later turn
    fleet.end()  # room comes first: it must go to `behind`, not to the request that left
    assert let_out(await behind)
    assert fleet.gate.stats.gone == {(0, ""): 1} and fleet.gate.stats.dispatched == {(0, ""): 1}
