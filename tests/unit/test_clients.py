"""The typed clients against Corral's own servers, in process: `UpControlClient` against `corral up`'s
control API, `SupervisorClient`'s one wait rule against a supervisor-shaped operations route. Every
refusal is one `APIError` carrying the status and the server's message, never the token."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.bundle_spec import BundleSpec
from corral.clients.calls import APIError
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.clients.up import UpControlClient
from corral.contracts.operations import OperationRecord, OperationStatus, SleepRequest
from corral.fleet.local.control import FleetControl
from corral.fleet.local.fleet import FleetSpec, LocalFleet


async def test_up_control_client_reads_groups_and_carries_refusals(tmp_path: Path) -> None:
    fleet = LocalFleet(FleetSpec(), tmp_path / "logs", tmp_path / "up.json")
    server = TestServer(FleetControl(fleet, "s3cret").app(), host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as session:
            listed = await UpControlClient(session, base, "s3cret").groups()
            assert listed.groups == []
            with pytest.raises(APIError) as refused:
                await UpControlClient(session, base, "not-the-key").groups()
            assert refused.value.status == 401 and "token_file" in refused.value.message
            assert "not-the-key" not in str(refused.value) and "s3cret" not in repr(
                UpControlClient(session, base, "s3cret")
            )
            bad = BundleSpec(name="x", command=("vllm", "serve"))
            with pytest.raises(APIError) as refused:
                await UpControlClient(session, base, "s3cret").add_group(bad, 1, 5.0)
            assert refused.value.status == 400 and "a local fleet runs `corral sim`" in refused.value.message
            daemon = BundleSpec(name="x", preload_command=("vllm", "preload", "--model", "m"))
            with pytest.raises(APIError) as refused:  # `corral up` starts no daemon: not silently ignored
                await UpControlClient(session, base, "s3cret").add_group(daemon, 1, 5.0)
            assert refused.value.status == 400
            assert "a local fleet runs no bundle's daemon" in refused.value.message
            with pytest.raises(APIError) as refused:
                await UpControlClient(session, base, "s3cret").retire_group("g9", 5.0)
            assert refused.value.status == 404 and "no serving group 'g9'" in refused.value.message
        assert fleet.engines == []
    finally:
        await server.close()


def _operations_app(finish_after: int) -> web.Application:
    """A supervisor's operation routes: a sleep that ends after `finish_after` reads of it."""
    reads = {"n": 0}

    def record(status: OperationStatus) -> bytes:
        return OperationRecord(operation_id="op-1", kind="sleep", status=status, started=time.time()).encode()

    async def start(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("level") == 2:
            return web.json_response({"error": {"message": "engine is SLEEPING: nothing to do"}}, status=409)
        return web.Response(body=record(OperationStatus.RUNNING), status=202, content_type="application/json")

    async def read(request: web.Request) -> web.Response:
        reads["n"] += 1
        done = finish_after and reads["n"] >= finish_after
        status = OperationStatus.SUCCEEDED if done else OperationStatus.RUNNING
        return web.Response(body=record(status), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/sleep", start)
    app.router.add_get("/v1/operations/{op_id}", read)
    return app


async def test_wait_for_operation_polls_to_the_end_and_stops_at_the_deadline() -> None:
    for finish_after, within in ((3, 30.0), (0, 0.05)):
        server = TestServer(_operations_app(finish_after), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                client = SupervisorClient(session, f"http://127.0.0.1:{server.port}", "tok")
                record, started = await client.start(SleepRequest(level=1))
                assert started and record.status is OperationStatus.RUNNING
                seen: list[OperationStatus] = []

                async def note(r: OperationRecord, seen: list[OperationStatus] = seen) -> None:
                    seen.append(r.status)

                if finish_after:
                    ended = await client.wait_for_operation("op-1", within=within, poll=0.01, on_poll=note)
                    assert ended.succeeded and seen == ["running", "running", "succeeded"]
                else:
                    with pytest.raises(OperationStillRunning) as still:
                        await client.wait_for_operation("op-1", within=within, poll=0.01, on_poll=note)
                    assert still.value.record.operation_id == "op-1" and seen[-1] == "running"
                with pytest.raises(APIError) as refused:
                    await client.start(SleepRequest(level=2))
                assert (
                    refused.value.status == 409
                    and refused.value.message == "engine is SLEEPING: nothing to do"
                )
        finally:
            await server.close()


async def test_an_unreachable_supervisor_is_an_api_error_without_a_status() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(APIError) as gone:
            await SupervisorClient(session, "http://127.0.0.1:9", "tok", timeout=2.0).state()
    assert gone.value.unreachable and "tok" not in str(gone.value)
