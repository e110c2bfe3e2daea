"""The admission gate's counts on the supervisor's `/metrics`: requests in flight per model or adapter
(up while a stream runs through the gate, back to 0 after), admitted per model or adapter, and refused
per model and reason (a path not on the data port, the engine SLEEPING). Real processes: a supervised
`corral sim` with sleep mode and a LoRA adapter, behind `--gate-port`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.integration.test_supervisor_gate import post
from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.procs import free_port
from tests.support.prom import sample, scrape

ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
IN_FLIGHT = "corral_supervisor_admission_in_flight"
ADMITTED = "corral_supervisor_admission_admitted_total"
REJECTED = "corral_supervisor_admission_rejected_total"


def metric(sup: Supervised, name: str, **labels: str) -> float | None:
    return sample(scrape(sup.url + "/metrics"), name, **labels)


def wait_metric(sup: Supervised, name: str, value: float, timeout: float, **labels: str) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = metric(sup, name, **labels)
        if seen == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name}{labels} is {seen}, not {value}, after {timeout}s")


def completion(model: str, max_tokens: int = 3, stream: bool = False) -> bytes:
    stream_flag = "true" if stream else "false"
    return (
        f'{{"model": "{model}", "prompt": "hi", "max_tokens": {max_tokens}, "stream": {stream_flag}}}'
    ).encode()


def test_gate_metrics_count_in_flight_admitted_and_rejected_per_model(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter-a"
    adapter.mkdir()
    gate_port = free_port()
    with supervised(
        sim_args=("--enable-sleep-mode", "--enable-lora", "--itl-ms", "40"),
        sup_args=(
            "--gate-port",
            str(gate_port),
            "--gate-host",
            "127.0.0.1",
            "--quiet-period",
            "0.3",
            "--lora",
            f"adapter-a={adapter}",
        ),
        env=ENV,
    ) as sup:
        sup.wait_state("READY", 30)
        gate = f"http://127.0.0.1:{gate_port}"
        assert metric(sup, ADMITTED, model="sim-model") is None  # nothing admitted yet

        for model in ("sim-model", "sim-model", "adapter-a"):
            status, _, body = post(gate + "/v1/completions", completion(model))
            assert status == 200, body
        assert metric(sup, ADMITTED, model="sim-model") == 2
        assert metric(sup, ADMITTED, model="adapter-a") == 1
        assert metric(sup, IN_FLIGHT, model="sim-model") == 0  # kept at 0 once idle, not dropped

        # a stream of 40 tokens at 40 ms each is in flight for well over a second
        answers: list[int] = []
        stream = threading.Thread(
            target=lambda: answers.append(
                post(gate + "/v1/completions", completion("adapter-a", 40, stream=True))[0]
            )
        )
        stream.start()
        try:
            wait_metric(sup, IN_FLIGHT, 1, 10, model="adapter-a")
            assert metric(sup, IN_FLIGHT, model="sim-model") == 0
        finally:
            stream.join(30)
        assert answers == [200]
        wait_metric(sup, IN_FLIGHT, 0, 10, model="adapter-a")
        assert metric(sup, ADMITTED, model="adapter-a") == 2

        assert post(gate + "/sleep?level=1")[0] == 404
        assert metric(sup, REJECTED, model="", reason="path_not_served") == 1

        status, op = http_json(sup.url + "/v1/sleep", "POST", {"level": 1})
        assert status == 202, op
        sup.wait_state("SLEEPING", 30)
        assert post(gate + "/v1/completions", completion("sim-model"))[0] == 503
        assert post(gate + "/v1/completions", completion("adapter-a"))[0] == 503
        assert metric(sup, REJECTED, model="sim-model", reason="not_ready") == 1
        assert metric(sup, REJECTED, model="adapter-a", reason="not_ready") == 1
        assert metric(sup, ADMITTED, model="sim-model") == 2  # refusals are not admissions
        gate_json = sup.state()["gate"]
        assert gate_json["admitted"] == 4 and gate_json["refused_not_ready"] == 2, gate_json
