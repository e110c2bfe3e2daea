"""The supervisor's HTTP surface: probes without auth (`/livez`, `/startupz`, `/readyz`, `/metrics`)
and the management API behind a bearer token (`/v1/state`, `/v1/state/watch`, `/v1/acks`,
`/v1/drain`, `/v1/shutdown`, `/v1/operations/{id}`).

`GET /v1/state/watch` is newline-delimited JSON (`application/x-ndjson`): the first line is the current
state, then one line per state event, each `{"type": "state", "epoch", "from", "to", "state",
"sub_state", "ready", "reason", "evidence", "time", "since", "fingerprint", "prefix_epoch", "role",
"pairing"}` (the engine's P/D role and pairing identity, `lifecycle/pd_role.py`; the running
bundle's fingerprint when the line was queued: a router keeps a serving group whole only on one; the
engine's prefix-cache epoch, `lifecycle/prefix_epoch.py`: a router forgets its prefixes when it moves;
`operation`, the runbook operation in flight or null), an `{"type": "operation", "epoch", "time",
"operation": {"kind", "id", "detail", "step", "since"} | null}` line each time an operation begins a
runbook step and once when it ends (`lifecycle/operation_lock.py`), and a
`{"type": "heartbeat", "epoch", "time"}` line when nothing happened for `heartbeat_seconds`. Epochs
only grow; a reader that reconnects gets the current state first, so it never needs a replay.

A router subscribes by naming itself: `GET /v1/state/watch?router_id=ID[&heartbeat=SECONDS]`; it counts
as subscribed while that connection is open, and acknowledges each epoch that took the engine out of
its routing with `POST /v1/acks {"router_id", "epoch", "state", "removal_latency_s", "undispatched"}`.
A drain waits for those acknowledgements (see `corral.supervisor.lifecycle.routers`).

Who may call it is `corral.supervisor.http.api_guard`'s business (origin, host, token, content type).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import ValidationError

from corral.contracts.operations import (
    DrainRequest,
    LoadAdapterRequest,
    ObservedRequest,
    ReloadRequest,
    SleepRequest,
    SwitchBundleRequest,
    UnloadAdapterRequest,
    WakeRequest,
)
from corral.contracts.supervisor import ROUTER_ID_MAX, AckRequest
from corral.contracts.wire import first_message
from corral.openai_errors import error_response
from corral.supervisor.http.api_guard import ManagementGuard
from corral.supervisor.lifecycle.drain import DrainPolicy
from corral.supervisor.lifecycle.operations import Operation, OperationConflict
from corral.supervisor.lifecycle.states import EngineState, StateEvent
from corral.supervisor.lifecycle.supervisor import EngineSupervisor
from corral.supervisor.runbook.cleanup import current_leftovers
from corral.supervisor.runbook.lora import LoadAdapterPlan, UnloadAdapterPlan
from corral.supervisor.runbook.observe import ObservedWindow
from corral.supervisor.runbook.reload import ReloadPlan
from corral.supervisor.runbook.run import start_operation
from corral.supervisor.runbook.sleep import SleepPlan
from corral.supervisor.runbook.switch_bundle import SwitchBundlePlan
from corral.supervisor.runbook.template import Refused
from corral.supervisor.runbook.wake import WakePlan

HEARTBEAT_LIMITS = (0.2, 60.0)
R = TypeVar("R", bound=ObservedRequest)
_STARTED_STATES = frozenset(
    {EngineState.READY, EngineState.DRAINING, EngineState.PAUSED, EngineState.SLEEPING, EngineState.WAKING}
)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return error_response(status, message, kind)


class SupervisorAPI:
    def __init__(
        self, supervisor: EngineSupervisor, token: str | None, heartbeat_seconds: float = 10.0
    ) -> None:
        self.supervisor = supervisor
        self._guard = ManagementGuard(token)
        self._heartbeat = heartbeat_seconds
        self._closing = asyncio.Event()
        self._ever_ready = False
        supervisor.machine.subscribe(self._note_ready)

    def _note_ready(self, event: StateEvent) -> None:
        if event.to_state is EngineState.READY:
            self._ever_ready = True

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard.middleware])
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/startupz", self.startupz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/state", self.state)
        app.router.add_get("/v1/state/watch", self.watch)
        app.router.add_get("/v1/leftovers", self.leftovers)
        app.router.add_post("/v1/acks", self.ack)
        app.router.add_post("/v1/drain", self.drain)
        app.router.add_post("/v1/shutdown", self.shutdown)
        app.router.add_get("/v1/operations/{op_id}", self.operation)
        app.router.add_post("/v1/sleep", self.sleep)
        app.router.add_post("/v1/wake", self.wake)
        app.router.add_post("/v1/reload", self.reload)
        app.router.add_post("/v1/bundle", self.switch_bundle)
        app.router.add_post("/v1/lora/load", self.lora_load)
        app.router.add_post("/v1/lora/unload", self.lora_unload)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing.set()

    def _probe_body(self, **extra: Any) -> dict[str, Any]:
        snap = self.supervisor.machine.snapshot()
        keys = ("state", "sub_state", "ready", "reason", "since", "epoch")
        return {**{k: snap[k] for k in keys}, **extra}

    # -- probes ---------------------------------------------------------------------------------

    async def livez(self, request: web.Request) -> web.Response:
        live, why = self.supervisor.live
        return _json(self._probe_body(live=live, live_reason=why), 200 if live else 503)

    async def startupz(self, request: web.Request) -> web.Response:
        machine = self.supervisor.machine
        started = machine.state in _STARTED_STATES or (
            self._ever_ready and machine.state is not EngineState.STOPPING
        )
        # a start held unready (--on-startup-failure stay-unready) is over: 200, or the startupProbe
        # would restart the pod that a person is meant to look at
        held = self.supervisor.held_unready
        body = self._probe_body(
            started=started,
            held_unready=held,
            gates=self.supervisor.gates.to_json(),
            restarts=len(self.supervisor.restarts),
            last_restart=self.supervisor.restarts[-1].to_json() if self.supervisor.restarts else None,
            # each check's outcome and reason; its evidence only behind the token, in /v1/state
            precheck=self.supervisor.precheck.summary() if self.supervisor.precheck is not None else None,
        )
        return _json(body, 200 if started or held else 503)

    async def readyz(self, request: web.Request) -> web.Response:
        ready = self.supervisor.machine.ready
        return _json(self._probe_body(), 200 if ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        self.supervisor.refresh_gate_metrics()
        return web.Response(
            body=self.supervisor.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    # -- management -----------------------------------------------------------------------------

    async def state(self, request: web.Request) -> web.Response:
        body = self.supervisor.state_body()
        body["operations"] = [op.to_json() for op in self.supervisor.operations.all()]
        return _json(body)

    async def leftovers(self, request: web.Request) -> web.Response:
        """What operations left behind, looked for now (`corral verify`'s cleanup check)."""
        return _json((await current_leftovers(self.supervisor)).to_wire())

    async def watch(self, request: web.Request) -> web.StreamResponse:
        machine = self.supervisor.machine
        router_id = request.query.get("router_id") or None
        if router_id is not None and len(router_id) > ROUTER_ID_MAX:
            return _error(400, f"router_id is longer than {ROUTER_ID_MAX} characters")
        heartbeat = self._heartbeat
        if "heartbeat" in request.query:
            try:
                heartbeat = float(request.query["heartbeat"])
            except ValueError:
                return _error(400, f"heartbeat {request.query['heartbeat']!r} is not a number of seconds")
            heartbeat = min(max(heartbeat, HEARTBEAT_LIMITS[0]), HEARTBEAT_LIMITS[1])
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1024)
        put = queue.put_nowait
        lock = self.supervisor.operation_lock

        def listener(event: StateEvent) -> None:
            try:
                bundle = self.supervisor.bundle
                fingerprint = bundle.fingerprint if bundle is not None else None
                prefix_epoch = self.supervisor.prefix_cache.token(self.supervisor.engine)
                line = {**event.to_json(), "since": machine.since, "fingerprint": fingerprint}
                line["bundle_name"] = self.supervisor.running_bundle.name  # issue 32: the dashboard's names
                pd = self.supervisor.publication.pd_identity()  # role and pairing identity (issue 16)
                kv_events = self.supervisor.publication.kv_events()  # issue 17
                operation = lock.in_flight()  # the runbook step in flight (issue 18)
                line = {**line, "prefix_epoch": prefix_epoch, **pd, "kv_events": kv_events}
                put({**line, "operation": operation})
            except asyncio.QueueFull:  # a reader this far behind reconnects and gets the state first
                stop()

        def step_listener(operation: dict[str, Any] | None) -> None:
            """One `operation` line per runbook step begun, and one (null) when the operation ends."""
            try:
                put(
                    {"type": "operation", "epoch": machine.epoch, "time": time.time(), "operation": operation}
                )
            except asyncio.QueueFull:
                stop()

        def stop() -> None:
            with contextlib.suppress(asyncio.QueueFull):
                queue.get_nowait()
            queue.put_nowait(None)

        resp = web.StreamResponse(
            headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        routers = self.supervisor.routers
        if router_id is not None:
            # subscribed before the first line is queued: a drain that starts from here on awaits it
            routers.subscribe(router_id)
        machine.subscribe(listener)
        lock.subscribe(step_listener)
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, closing}, timeout=heartbeat, return_when="FIRST_COMPLETED"
                )
                if getter not in done:
                    getter.cancel()
                    if closing in done:
                        break
                    line: dict[str, Any] = {"type": "heartbeat", "epoch": machine.epoch, "time": time.time()}
                else:
                    item = getter.result()
                    if item is None:
                        break
                    line = item
                await resp.write(orjson.dumps(line) + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            closing.cancel()
            machine.unsubscribe(listener)
            lock.unsubscribe(step_listener)
            if router_id is not None:
                routers.unsubscribe(router_id)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await resp.write_eof()
        return resp

    async def ack(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"body is not JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, 'body must be a JSON object: {"router_id": "...", "epoch": N}')
        try:
            asked = AckRequest.model_validate(body)
        except ValidationError as exc:
            return _error(400, first_message(exc))
        if asked.epoch > self.supervisor.machine.epoch:
            return _error(
                400, f"epoch {asked.epoch} is ahead of this supervisor's ({self.supervisor.machine.epoch})"
            )
        ack = self.supervisor.routers.acknowledge(
            asked.router_id,
            asked.epoch,
            state=asked.state,
            removal_latency_s=asked.removal_latency_s,
            undispatched=asked.undispatched,
            transfers_unconfirmed=asked.transfers_unconfirmed,
        )
        return _json(ack.to_json())

    async def _op_request(self, request: web.Request) -> tuple[str | None, dict[str, Any]] | web.Response:
        body: dict[str, Any] = {}
        raw = await request.read()
        if raw.strip():
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                return _error(400, f"body is not JSON: {exc}")
            if not isinstance(parsed, dict):
                return _error(400, "body must be a JSON object")
            body = parsed
        op_id = body.get("operation_id") or request.headers.get("Idempotency-Key")
        if op_id is not None and not isinstance(op_id, str):
            return _error(400, "operation_id must be a string")
        return op_id, body

    @staticmethod
    def _op_response(op: Operation, started: bool) -> web.Response:
        return _json(op.to_json(), 202 if started else 200)

    async def drain(self, request: web.Request) -> web.Response:
        parsed = await self._op_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        op_id, body = parsed
        try:
            asked = DrainRequest.model_validate(body)
        except ValidationError as exc:
            return _error(400, first_message(exc))
        policy = DrainPolicy(asked.policy) if asked.policy is not None else None
        try:
            op, started = self.supervisor.request_drain(op_id, policy)
        except OperationConflict as exc:
            return _error(409, str(exc))
        return self._op_response(op, started)

    async def shutdown(self, request: web.Request) -> web.Response:
        parsed = await self._op_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        op_id, _ = parsed
        try:
            op, started = self.supervisor.request_shutdown(op_id)
        except OperationConflict as exc:
            return _error(409, str(exc))
        return self._op_response(op, started)

    # -- runbook operations (corral.supervisor.runbook) ----------------------------------------------

    async def _runbook_op(
        self,
        request: web.Request,
        asked: type[R],
        make_plan: Callable[[R], Any],
        detail: Callable[[R], str | None] = lambda _: None,
    ) -> web.Response:
        parsed = await self._op_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        op_id, body = parsed
        try:
            validated = asked.model_validate(body)
            plan = make_plan(validated)
            observer = ObservedWindow.asked(self.supervisor, plan.kind, validated)
            op, started = await start_operation(self.supervisor, plan, op_id, observer, detail(validated))
        except Refused as exc:
            return _error(409, str(exc), "conflict_error")
        except OperationConflict as exc:
            return _error(409, str(exc))
        except ValidationError as exc:
            return _error(400, f"bad operation body: {first_message(exc)}")
        except (TypeError, ValueError) as exc:
            return _error(400, f"bad operation body: {exc}")
        return self._op_response(op, started)

    async def sleep(self, request: web.Request) -> web.Response:
        return await self._runbook_op(
            request,
            SleepRequest,
            lambda asked: SleepPlan(self.supervisor, asked.level, asked.mode, asked.release_kv),
            lambda asked: f"level {asked.level}",
        )

    async def wake(self, request: web.Request) -> web.Response:
        return await self._runbook_op(
            request, WakeRequest, lambda asked: WakePlan(self.supervisor, asked.tags, asked.reload)
        )

    async def reload(self, request: web.Request) -> web.Response:
        return await self._runbook_op(
            request, ReloadRequest, lambda asked: ReloadPlan(self.supervisor, asked.mode)
        )

    async def switch_bundle(self, request: web.Request) -> web.Response:
        return await self._runbook_op(
            request,
            SwitchBundleRequest,
            lambda asked: SwitchBundlePlan(self.supervisor, asked.name, asked.ready_timeout),
            lambda asked: f"to {asked.name}",
        )

    async def lora_load(self, request: web.Request) -> web.Response:
        return await self._runbook_op(
            request,
            LoadAdapterRequest,
            lambda asked: LoadAdapterPlan(self.supervisor, asked.name, asked.adapter_path),
            lambda asked: str(asked.name),
        )

    async def lora_unload(self, request: web.Request) -> web.Response:
        return await self._runbook_op(
            request,
            UnloadAdapterRequest,
            lambda asked: UnloadAdapterPlan(self.supervisor, asked.name),
            lambda asked: str(asked.name),
        )

    async def operation(self, request: web.Request) -> web.Response:
        op = self.supervisor.operations.get(request.match_info["op_id"])
        if op is None:
            return _error(404, f"no operation {request.match_info['op_id']!r}", "not_found_error")
        return _json(op.to_json())
