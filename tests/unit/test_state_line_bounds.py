"""A supervisor's state lines are untrusted input (issue 27): a line over `MAX_LINE_BYTES`, or a state
line with a field past its bound (a 100 KiB reason, 10,000 withdrawn adapters), is refused as a broken
stream is: counted, the endpoint out of routing, nothing of it stored, and the stream reconnected, where a
sane line puts the endpoint back. Against a scripted supervisor on loopback."""

from __future__ import annotations

from typing import Any

import pytest

from corral.router.discovery.state_line_bounds import MAX_LINE_BYTES, MAX_REASON_CHARS
from corral.router.discovery.supervisor_stream import SupervisorStreams
from corral.router.membership.membership import Membership
from corral.router.telemetry.engine_input import STATE_LINE
from corral.router.telemetry.metrics import RouterMetrics
from tests.unit.test_router_supervisor_stream import SETTINGS, FakeSupervisor, add_endpoint, state_line, until


def _with(epoch: int, **fields: Any) -> dict[str, Any]:
    return {**state_line(epoch, "READY"), **fields}


@pytest.mark.parametrize(
    ("hostile", "reason"),
    [
        (_with(2, reason="x" * (MAX_REASON_CHARS + 1)), "out_of_bounds"),
        (_with(2, fingerprint="f" * 100_000), "out_of_bounds"),
        (_with(2, evidence={"withdrawn_adapters": [f"a{n}" for n in range(10_000)]}), "out_of_bounds"),
        (_with(2, operation={"kind": "sleep", "step": "s" * 5000}), "out_of_bounds"),
        (_with(2, evidence={"pad": "p" * (MAX_LINE_BYTES * 3)}), "line_too_long"),
    ],
)
async def test_a_line_out_of_bounds_breaks_the_stream_is_counted_and_never_stored(
    hostile: dict[str, Any], reason: str
) -> None:
    supervisor = FakeSupervisor()
    await supervisor.start()
    membership = Membership()
    metrics = RouterMetrics()
    streams = SupervisorStreams(membership, metrics, SETTINGS)
    await streams.start()
    try:
        first = supervisor.script()
        endpoint = add_endpoint(membership, supervisor.url)
        first.put_nowait(state_line(1, "READY"))
        await until(lambda: endpoint.in_routing)
        again = supervisor.script()
        first.put_nowait(hostile)
        await until(lambda: not endpoint.in_routing)
        assert metrics.engine_input.refused == {(STATE_LINE, reason): 1}
        assert endpoint.supervisor is not None and endpoint.supervisor.epoch == 1
        assert len(endpoint.supervisor.reason) < 100 and len(endpoint.supervisor.link_reason) < 300
        again.put_nowait(state_line(3, "READY"))  # the reconnected stream's sane line puts it back
        await until(lambda: endpoint.in_routing, within=5.0)
    finally:
        await streams.stop()
        await supervisor.stop()
