"""An engine whose KV-cache socket comes up late (the crash-on-first-start case), reproduced and fixed.

Without the supervisor, the engine started before its socket exists crashes at init. Under
`corral supervise --wait-for unix:SOCK` the engine is started only once the socket listens, reaches
READY with zero crashes and zero restarts, and /readyz says 503 all the way until the smoke request
passed. A gate that never opens ends FAILED naming the gate, without a crash loop.
"""

from __future__ import annotations

import socket
import time
import urllib.request

from tests.integration.test_supervisor_support import (
    short_tmp_dir,
    sim_command,
    supervised,
)
from tests.support.procs import CorralProcess, free_port

SOCKET_DELAY_S = 10.0


def test_without_the_supervisor_the_engine_crashes_when_its_socket_is_not_up() -> None:
    sock = short_tmp_dir() / "vineyard.sock"
    port = free_port()
    proc = CorralProcess(sim_command(port, "--requires", f"unix:{sock}")[3:])
    try:
        code = proc.wait_exit(timeout=30)
        output = proc.output()
    finally:
        proc.stop()
    assert code != 0
    # the log line is the contract: vLLM writes it so, and the supervisor and operators read it
    assert "ERROR" in output and str(sock) in output


def test_under_the_supervisor_the_engine_waits_for_its_socket_and_starts_once() -> None:
    sock_path = short_tmp_dir() / "vineyard.sock"
    engine_port = free_port()
    with supervised(
        engine_port=engine_port,
        sim_args=("--requires", f"unix:{sock_path}", "--startup-seconds", "1.5"),
        sup_args=("--wait-for", f"unix:{sock_path}", "--dependency-timeout", "60"),
    ) as sup:
        started = time.monotonic()
        listener: socket.socket | None = None
        socket_created_at = float("inf")
        seen: list[tuple[int, str, str | None]] = []  # (readyz status, state, sub_state) as polled
        try:
            while time.monotonic() - started < 60:
                if listener is None and time.monotonic() - started >= SOCKET_DELAY_S:
                    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    listener.bind(str(sock_path))
                    listener.listen(16)
                    socket_created_at = time.time()
                status, body = sup.probe("/readyz")
                seen.append((status, body["state"], body["sub_state"]))
                if status == 200:
                    break
                if len(seen) == 10:  # while waiting: /startupz names the gate and its last error
                    code, startupz = sup.probe("/startupz")
                    assert code == 503 and startupz["sub_state"] == "waiting_dependencies"
                    assert startupz["gates"][0]["gate"] == f"unix:{sock_path}"
                    assert startupz["gates"][0]["last_error"]
                time.sleep(0.1)
            state = sup.state()
        finally:
            if listener is not None:
                listener.close()
        assert seen[-1][0] == 200, sup.proc.output()
        before_ready = seen[:-1]
        assert all(status == 503 for status, _, _ in before_ready)
        sub_states = {sub for _, _, sub in before_ready}
        assert "waiting_dependencies" in sub_states  # 503 during the wait
        assert sub_states & {"engine_starting", "loading_model", "allocating_kv_cache", "server_starting"}

        # zero engine crashes, zero restarts: one engine process, never exited
        assert state["state"] == "READY" and state["restarts"] == []
        assert len(sup.engine_pids()) == 1
        assert not [r for r in sup.oplog() if r["record"] in ("engine_exited", "engine_restart")]
        engine_lines = [line for line in sup.proc.output().splitlines() if line.startswith("[engine]")]
        # the engine's log is the contract here: an operator reading it sees no error from the wait
        assert not [line for line in engine_lines if " ERROR " in line]

        # READY only after the smoke request passed; the engine was not even started before the socket
        transitions = sup.transitions()
        ready = next(t for t in transitions if t["to"] == "READY")
        assert ready["evidence"]["text"] and ready["evidence"]["completion_tokens"] >= 1
        order = [t["sub_state"] for t in transitions if t["to"] == "STARTING"]
        assert (
            order.index("waiting_dependencies")
            < order.index("engine_starting")
            < order.index("smoke_testing")
        )
        engine_started = next(r for r in sup.oplog() if r["record"] == "engine_started")
        assert engine_started["time"] >= socket_created_at
        with urllib.request.urlopen(sup.url + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        gate_wait = next(
            line for line in metrics.splitlines() if line.startswith("corral_supervisor_gate_wait_seconds{")
        )
        assert float(gate_wait.rsplit(" ", 1)[1]) >= SOCKET_DELAY_S - 1
        assert 'corral_supervisor_state{state="READY"} 1.0' in metrics
        assert "corral_supervisor_engine_restarts_total{" not in metrics
        [gate] = sup.state()["gates"]  # the gate the supervisor waited on, opened, and for how long
        assert gate["gate"] == f"unix:{sock_path}" and gate["open"] is True
        assert gate["waited_seconds"] >= SOCKET_DELAY_S - 1 and gate["attempts"] >= 1


def test_a_gate_that_never_opens_ends_failed_naming_it() -> None:
    missing = short_tmp_dir() / "never.sock"
    with supervised(
        sim_args=("--requires", f"unix:{missing}"),
        sup_args=("--wait-for", f"unix:{missing}", "--dependency-timeout", "2"),
    ) as sup:
        body = sup.wait_state("FAILED", timeout=20)
        assert f"unix:{missing}" in body["reason"] and "2s" in body["reason"]
        assert sup.engine_pids() == []  # never started, so never crashed
        live, livez = sup.probe("/livez")
        assert live == 503 and f"unix:{missing}" in livez["live_reason"]
        assert sup.probe("/readyz")[0] == 503 and sup.probe("/startupz")[0] == 503
        sup.quiet_for(1.0, body["epoch"])  # and it stays FAILED, by the supervisor's own clock: no loop
        assert sup.state()["epoch"] == body["epoch"]
