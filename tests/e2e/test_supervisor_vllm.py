"""The supervisor's start → ready → drain → shutdown cycle against a real vLLM CPU engine.

What only a real engine can show: the startup phases are read from vLLM's own log lines, readiness
waits for a real smoke completion, and a drain with a stream in flight lets that stream finish before
the engine gets SIGTERM — where vLLM with its default `--shutdown-timeout 0` would otherwise leave the
request unanswered and never exit (see tests/data/vllm-samples/README.md).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.conftest import SERVED_NAME, vllm_command, vllm_env
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import http_status, wait_until

pytestmark = pytest.mark.e2e


class LongStream:
    """One streamed completion on its own thread, long enough to be in flight across a drain."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url
        self.first_byte = threading.Event()
        self.answered = threading.Event()
        self.status = 0
        self.body = b""
        self.ended_at = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": SERVED_NAME, "prompt": "once upon a time", "max_tokens": 250,
                "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
        chunks = []
        with httpx.stream("POST", self.engine_url + "/v1/completions", json=body, timeout=120) as resp:
            self.status = resp.status_code
            self.answered.set()
            for chunk in resp.iter_bytes():
                chunks.append(chunk)
                self.first_byte.set()
        self.body = b"".join(chunks)
        self.ended_at = time.monotonic()
        self.first_byte.set()


def oplog_events(state_dir: Path) -> list[dict[str, object]]:
    lines = (state_dir / "oplog.jsonl").read_text().splitlines()
    return [orjson.loads(line) for line in lines if line.strip()]


def test_start_ready_drain_shutdown_cycle(vllm_python: str, tiny_model: Path, tmp_path: Path) -> None:
    engine_port, supervisor_port = free_port(), free_port()
    engine_url, supervisor_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{supervisor_port}"
    state_dir = tmp_path / "state"
    # vLLM keeps its default --shutdown-timeout 0: the supervisor's drain is what saves the stream
    engine = vllm_command(vllm_python, tiny_model, engine_port)
    supervisor = CorralProcess(
        [
            "supervise",
            "--port", str(supervisor_port),
            "--engine-url", engine_url,
            "--model", SERVED_NAME,
            "--state-dir", str(state_dir),
            "--startup-timeout", "400",
            "--propagation-timeout", "3",
            "--quiet-period", "1",
            "--drain-timeout", "60",
            "--shutdown-timeout", "20",
            "--",
            *engine,
        ],
        env=vllm_env(),
    )  # fmt: skip
    try:
        # STARTING: probes answer at once, readiness is false while vLLM loads
        wait_until(lambda: http_status(supervisor_url + "/livez") == 200, 30, "the supervisor's probes")
        assert http_status(supervisor_url + "/readyz") == 503
        wait_until(lambda: http_status(supervisor_url + "/readyz") == 200, 400, "READY")
        state = httpx.get(supervisor_url + "/v1/state").json()
        assert state["state"] == "READY" and state["engine"]["model"] == SERVED_NAME
        assert state["restarts"] == []
        phases = [e.get("sub_state") for e in oplog_events(state_dir) if e.get("to") == "STARTING"]
        # phases read from vLLM's own log lines, in order, before the smoke request
        for earlier, later in [
            ("loading_model", "allocating_kv_cache"),
            ("server_starting", "smoke_testing"),
        ]:
            assert earlier in phases and later in phases, phases
            assert phases.index(earlier) < phases.index(later), phases

        # streams in flight when the drain starts must complete: each records when its first byte
        # came and when it ended, so the test proves at least one was still running at SIGTERM
        # (the tiny model generates fast: SIGTERM goes out as soon as the first stream has begun)
        engine_pid = httpx.get(supervisor_url + "/v1/state").json()["engine"]["pid"]
        streams = [LongStream(engine_url) for _ in range(8)]
        for stream in streams:
            stream.thread.start()
        assert streams[0].first_byte.wait(60), "the first stream never started"
        # every stream must be in flight (answered by the engine) before the drain: one whose thread
        # the scheduler had not yet run would connect after the engine stopped, which is no fault
        for stream in streams:
            assert stream.answered.wait(60), "a stream was never answered"
        sigterm_at = time.monotonic()
        supervisor.signal(signal.SIGTERM)
        wait_until(lambda: http_status(supervisor_url + "/readyz") != 200, 5, "readiness to drop")
        for stream in streams:
            stream.thread.join(timeout=120)
            assert stream.status == 200
            assert stream.body.endswith(b"data: [DONE]\n\n"), stream.body[-200:]
            assert b'"finish_reason":"length"' in stream.body
        assert any(s.ended_at > sigterm_at for s in streams), "every stream ended before the drain began"
        assert supervisor.wait_exit(90) == 0, supervisor.output()[-3000:]
        with pytest.raises(ProcessLookupError):
            os.kill(engine_pid, 0)
        events = oplog_events(state_dir)
        subs = [(e.get("to"), e.get("sub_state")) for e in events]
        drain_steps = [s for s in subs if s[0] in ("DRAINING", "STOPPING")]
        assert drain_steps[0] == ("DRAINING", "leaving_routing"), drain_steps
        assert ("DRAINING", "waiting_in_flight") in drain_steps, drain_steps
        assert drain_steps.index(("DRAINING", "waiting_in_flight")) < drain_steps.index(
            ("STOPPING", "stopping_engine")
        )
    finally:
        supervisor.stop(grace=30)
