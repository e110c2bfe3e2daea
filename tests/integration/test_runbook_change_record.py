"""Every runbook operation leaves its change record, with real processes: a supervised `corral sim`
behind the admission gate is put to sleep (level 1, mode abort, a stream running through the gate) and
woken by `corral sleep` and `corral wake`. Each operation's result, oplog and the file the CLI wrote hold
the same record, valid against the schema: steps timed, GPU and host memory before/after from the
sim's figures, the gate's counters before/after, the aborted stream named as a forced exit with
`tokens_emitted: true`, and the command that undoes it. A refused wake leaves a `refused` record."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from corral.contracts.records import ChangeRecord
from tests.integration.test_forced_exits import read_stream
from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.procs import free_port

GIB = 2**30
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", "--itl-ms", "50")
SUP_ARGS = ("--propagation-timeout", "2", "--quiet-period", "0.3")
STEPS = ["precheck", "remove_from_routing", "drain_policy", "execute", "verify", "postcheck"]


def corral(state_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    env.pop("CORRAL_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def records_of(sup: Supervised, op_id: str | None = None, outcome: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in sup.oplog()
        if r["record"] == "change_record"
        and (op_id is None or r["id"] == op_id)
        and (outcome is None or r["outcome"] == outcome)
    ]


def check_record(
    sup: Supervised, run: subprocess.CompletedProcess[str], state_home: Path, kind: str
) -> ChangeRecord:
    """The file the CLI wrote, the operation's result and the oplog hold one and the same record."""
    assert run.returncode == 0, run.stdout + run.stderr
    path = state_home / "corral" / f"{kind}-{sup.url.rsplit(':', 1)[1]}.json"
    # the printed answer is the contract: what the person who ran the command reads
    assert f"change record: {path}" in run.stdout, run.stdout
    record = ChangeRecord.model_validate(orjson.loads(path.read_bytes()))
    assert record.kind == kind and record.outcome == "succeeded" and record.id is not None
    status, op = http_json(f"{sup.url}/v1/operations/{record.id}")
    assert status == 200 and ChangeRecord.model_validate(op["result"]["change_record"]) == record
    (logged,) = records_of(sup, record.id)
    line = {k: v for k, v in logged.items() if k not in ("record", "time")}  # the oplog's own fields
    assert ChangeRecord.model_validate(line) == record
    assert [s.step for s in record.steps][: len(STEPS)] == STEPS and all(s.ok for s in record.steps)
    starts = [s.started for s in record.steps]
    assert record.started == starts[0] <= record.finished and starts == sorted(starts), starts
    assert record.from_bundles == {sup.engine_url: record.to_bundle}
    assert record.to_bundle is not None and record.to_bundle["name"] == "initial"
    print(f"{kind} record:", orjson.dumps(record.to_file()).decode())
    return record


async def test_sleep_and_wake_leave_their_change_records(tmp_path: Path) -> None:
    gate_port = free_port()
    gate_args = ("--gate-port", str(gate_port), "--gate-host", "127.0.0.1")
    with supervised(sim_args=SIM_ARGS, sup_args=(*gate_args, *SUP_ARGS), env=DEV) as sup:
        await asyncio.to_thread(sup.wait_state, "READY", 30)
        stream = {"model": "sim-model", "prompt": "hi", "max_tokens": 2000, "stream": True}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            first = asyncio.Event()
            url = f"http://127.0.0.1:{gate_port}/v1/completions"
            streaming = asyncio.create_task(read_stream(session, url, stream, "cr-streaming", first))
            await asyncio.wait_for(first.wait(), 30)
            slept = await asyncio.to_thread(
                corral, tmp_path, "sleep", "--supervisor", sup.url, "--level", "1", "--mode", "abort"
            )
            await asyncio.wait_for(streaming, 30)  # how its client saw the abort: test_forced_exits

        asleep = check_record(sup, slept, tmp_path, "sleep")
        gpu, host = asleep.memory
        assert (gpu.pool, gpu.source, gpu.before_bytes, gpu.after_bytes) == (
            "gpu",
            "engine_metrics",
            6 * GIB,
            0,
        )
        assert gpu.delta_bytes == -6 * GIB and gpu.engine == sup.engine_url
        assert (host.pool, host.before_bytes, host.after_bytes, host.delta_bytes) == (
            "host",
            0,
            2 * GIB,
            2 * GIB,
        )
        assert asleep.forced_exits is not None
        (aborted,) = asleep.forced_exits
        assert (aborted.request_id, aborted.tokens_emitted) == ("cr-streaming", True), aborted
        failures = asleep.request_failures
        assert failures is not None and failures.source == "gate"
        assert failures.during.stream_failures == 1 and failures.after.requests >= 1, failures
        assert asleep.rollback_point is not None
        assert asleep.rollback_point.command == f"corral wake --supervisor {sup.url}"

        woke = await asyncio.to_thread(corral, tmp_path, "wake", "--supervisor", sup.url)
        awake = check_record(sup, woke, tmp_path, "wake")
        gpu, host = awake.memory
        assert (gpu.before_bytes, gpu.after_bytes, gpu.delta_bytes) == (0, 6 * GIB, 6 * GIB)
        assert (host.before_bytes, host.after_bytes) == (2 * GIB, 0)
        assert awake.forced_exits == [] and awake.rollback_point is not None
        assert awake.rollback_point.command == f"corral sleep --supervisor {sup.url} --level 1"
        # warmup apart from steady state: VERIFY's first-request TTFT, or why not
        assert awake.latency.warmup_ttft_ms or any(n.startswith("latency.warmup") for n in awake.not_measured)

        # a wake of a READY engine is refused, changes nothing, and says so in the oplog only
        status, _ = http_json(sup.url + "/v1/wake", "POST", {"operation_id": "wake-refused"})
        assert status == 409
        (refused,) = records_of(sup, "wake-refused")
        assert refused["outcome"] == "refused" and "not SLEEPING" in refused["reason"], refused
        assert refused["rollback_point"] is None and refused["steps"][0]["ok"] is False
