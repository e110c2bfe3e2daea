"""Startup VERIFY of a preload-backed engine (issue 29 item 5): READY needs vLLM's `Mapped N tensors from
the weight cache daemon (MODE mode)` line in the engine's log — the line is the contract, printed by
vLLM's ipc_loader.py (and by the simulator the same way); nothing else on vLLM's surface tells a load
from the daemon from a disk load. Under VLLM_LOGGING_LEVEL=WARNING vLLM does not print it (an INFO
line): the start fails naming the missing evidence and what to do. Real processes: `corral sim preload`
and `corral sim --load-format ipc_cache` under `corral supervise`."""

from __future__ import annotations

import json

from tests.integration.test_supervisor_preload import daemon_command
from tests.integration.test_supervisor_support import (
    Supervised,
    kill_leftovers,
    short_tmp_dir,
    start_supervised,
)
from tests.support.procs import free_port


def supervised(mode: str, env: dict[str, str] | None = None) -> Supervised:
    socket = short_tmp_dir() / "wc.sock"
    health_port = free_port()
    loader = json.dumps({"socket_path": str(socket), "mode": mode, "fallback": True})
    return start_supervised(
        sim_args=("--load-format", "ipc_cache", "--model-loader-extra-config", loader),
        sup_args=(
            "--preload-command",
            daemon_command(health_port, socket, "--startup-seconds", "0.5"),
            "--preload-health",
            f"http://127.0.0.1:{health_port}/health",
        ),
        env=env,
    )


def test_ready_records_the_mapped_tensors_and_mode() -> None:
    sup = supervised("zero_copy")
    try:
        sup.wait_state("READY", 40)
        ready = [t for t in sup.transitions() if t["to"] == "READY"][-1]
        assert ready["evidence"]["weights_from"] == "daemon", ready
        verified = [r for r in sup.oplog() if r["record"] == "preload_verify"][-1]
        assert verified["source"] == "daemon" and verified["problem"] is None, verified
        # the engine's own log line, as vLLM prints it: "Mapped 291 tensors … (zero_copy mode)"
        assert [(m["tensors"], m["mode"]) for m in verified["mapped"]] == [(291, "zero_copy")], verified
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)


def test_a_start_without_the_mapped_line_fails_verify_naming_it() -> None:
    sup = supervised("zero_copy", env={"VLLM_LOGGING_LEVEL": "WARNING"})
    try:
        body = sup.wait_state("FAILED", 40)
        assert "no 'Mapped N tensors from the weight cache daemon (MODE mode)' line" in body["reason"], body
        assert "VLLM_LOGGING_LEVEL is INFO or DEBUG" in body["reason"], body
        assert not [t for t in sup.transitions() if t["to"] == "READY"]
        assert sup.probe("/readyz")[0] == 503
        failed = [r for r in sup.oplog() if r["record"] == "preload_verify"][-1]
        assert failed["source"] is None and failed["mapped"] == [] and failed["fallbacks"] == [], failed
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
