"""Scale from zero: a request for a model with no routable engine asks for one, and either waits for
it or is answered at once.

Asking for an engine: where an engine of the model sleeps (its supervisor's state stream says
SLEEPING), one of their supervisors is asked to wake it (every sleeping member, for an engine in a
serving group, which is routed only whole), once (one wake per model at a time, and an operation id
derived from the sleep's epoch, so that every router asking for the same sleep joins the same wake);
where none sleeps and none is on its way (STARTING, WAKING), the router raises a scale-up signal
instead: counted once per episode without an engine (`corral_router_scale_up_signals_total`) and
shown while it lasts (`corral_router_model_desired_replicas` is at least 1 while requests wait), for
an autoscaler to read (docs/scaling.md).

Then, by `mode`: `hold` keeps the request (at most `max_held` per model; `hold_seconds` is the
no-endpoint TTL) until an engine is eligible, and the proxy forwards it; past its TTL the proxy
answers 503 with Retry-After as for any model without a READY engine; a request beyond `max_held`
is answered 503 at once. `reject` answers 503 with Retry-After at once, the engine still asked for.
The router's metrics count each wake, each request held and how each hold ended (`served`,
`timed_out`), the answers given at once and why, and show the requests held now and the oldest
one's age. The wake call carries the token of the supervisor it goes to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp
import orjson

from corral.engine_state import EngineState
from corral.router.discovery.supervisor_stream import TokenFor, bearer
from corral.router.membership.endpoint import Endpoint
from corral.router.membership.membership import Membership
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.wake_on_demand")

HOLD = "hold"
REJECT = "reject"
MODES = (HOLD, REJECT)
MAX_HELD_LIMIT = 100_000  # --wake-hold-max's bound (held requests per model)
DEFAULT_MAX_HELD = 1024
_ON_ITS_WAY = frozenset({EngineState.STARTING, EngineState.WAKING})
_POLL_SECONDS = 0.02  # how often a model's waiters look at the routing table, one look per model


@dataclass(frozen=True)
class WakeSettings:
    hold_seconds: float  # the no-endpoint TTL (--wake-hold-seconds)
    mode: str = HOLD  # --wake-mode
    max_held: int = DEFAULT_MAX_HELD  # --wake-hold-max, per model

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"wake mode {self.mode!r}: use {' or '.join(MODES)}")
        if not 1 <= self.max_held <= MAX_HELD_LIMIT:
            raise ValueError(f"wake hold max {self.max_held}: use 1 to {MAX_HELD_LIMIT}")


class _Waiting:
    """The requests of one model held now (their start times), and one poller that sets `ready` once
    the model has an eligible engine."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}
        self.ready = asyncio.Event()
        self.poller: asyncio.Task[None] | None = None


class WakeOnDemand:
    def __init__(
        self, membership: Membership, token_for: TokenFor, settings: WakeSettings, metrics: RouterMetrics
    ) -> None:
        self._membership = membership
        self._token_for = token_for
        self.settings = settings
        self.hold_seconds = settings.hold_seconds
        self._metrics = metrics
        self._wakes: dict[str, asyncio.Task[None]] = {}  # model -> its wake call in progress
        self._signalled: set[str] = set()  # models whose scale-up signal stands (no engine yet)
        self._waiting: dict[str, _Waiting] = {}
        self._tickets = 0

    # -- what the metrics show ----------------------------------------------------------------

    def held_now(self) -> dict[str, int]:
        return {model: len(w.started) for model, w in self._waiting.items() if w.started}

    def oldest_held_seconds(self, now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        return {model: now - min(w.started.values()) for model, w in self._waiting.items() if w.started}

    def wanting(self) -> frozenset[str]:
        """Models whose scale-up signal stands: no engine, none asleep, none on its way."""
        return frozenset(self._signalled)

    # -- the request's side -------------------------------------------------------------------

    async def hold(self, model: str) -> str | None:
        """None once `model` has an eligible endpoint, at once when it has no endpoint at all (the
        proxy answers as for any unknown model), or after `hold_seconds`; else why the request is
        answered 503 now (words for the client: no engine, address or exception)."""
        if self._membership.eligible(model):
            self._signalled.discard(model)
            return None
        serving = [e for e in self._membership.endpoints() if model in e.models]
        if not serving:
            return None
        self._ask_for_engine(model, serving)
        settings = self.settings
        if settings.mode == REJECT:
            self._metrics.count_no_engine_answer(model, "mode_reject")
            return "no engine is awake; one has been asked for"
        waiting = self._waiting.setdefault(model, _Waiting())
        if len(waiting.started) >= settings.max_held:
            self._metrics.count_no_engine_answer(model, "hold_full")
            return f"{settings.max_held} requests already wait for an engine"
        self._tickets += 1
        ticket = self._tickets
        waiting.started[ticket] = time.monotonic()
        if waiting.poller is None or waiting.poller.done():
            waiting.ready.clear()
            waiting.poller = asyncio.create_task(self._poll(model, waiting), name=f"corral-hold-{model}")
        self._metrics.count_held(model)
        try:
            await asyncio.wait_for(waiting.ready.wait(), settings.hold_seconds)
        except TimeoutError:
            self._metrics.count_hold_outcome(model, "timed_out")
        else:
            self._signalled.discard(model)
            self._metrics.count_hold_outcome(model, "served")
        finally:
            del waiting.started[ticket]
            if not waiting.started and waiting.poller is not None:
                waiting.poller.cancel()
                waiting.poller = None
        return None

    async def _poll(self, model: str, waiting: _Waiting) -> None:
        # membership tells no one of a change: one look per model every _POLL_SECONDS, for all its waiters
        while True:
            if self._membership.eligible(model):
                waiting.ready.set()
                return
            await asyncio.sleep(_POLL_SECONDS)

    def _ask_for_engine(self, model: str, serving: list[Endpoint]) -> None:
        sleeping = [e for e in serving if _state(e) is EngineState.SLEEPING]
        if sleeping:
            task = self._wakes.get(model)
            if task is None or task.done():
                # a member of a serving group is routed only with its whole group: wake every sleeping member
                group = [e for e in self._membership.group_members(sleeping[0]) if e in sleeping]
                task = asyncio.create_task(self._wake_all(group or sleeping[:1]), name=f"corral-wake-{model}")
                self._wakes[model] = task
                self._metrics.count_wake(model)
            return
        if any(_state(e) in _ON_ITS_WAY for e in serving) or model in self._signalled:
            return
        self._signalled.add(model)
        self._metrics.count_scale_up(model)
        log.warning(
            "no engine of %s is routable, none sleeps and none is starting: scale-up signal raised", model
        )

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


def _state(endpoint: Endpoint) -> EngineState | None:
    return endpoint.supervisor.state if endpoint.supervisor is not None else None
