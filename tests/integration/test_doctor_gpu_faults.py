"""A supervised `corral sim` engine dies of a GPU fault (`--gpu-fault`: the CUDA or NCCL lines vLLM and
torch print, then exit 1, as vLLM does; no figure vLLM lacks is involved): the supervisor's FAILED names
the fault and keeps it in /v1/state, and `corral doctor --json` gives its own branch and next command
instead of the generic startup crash. A driver Xid written to the kernel log the supervisor reads
(CORRAL_KERNEL_LOG) is named the same way; and a bundle that dies of a CUDA error after the stable one
served shows the graph/NCCL settings it changed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.test_supervisor_support import http_json, start_supervised
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

# `python -I`: the simulator of this tree (its installed package) whatever PYTHONPATH gives the supervisor
# and doctor, so that against an older Corral the test fails on what they make of the fault, not on the
# simulator's flag; `-Im corral sim` still reads as the simulator to PRECHECK
SIM = [sys.executable, "-Im", "corral", "sim"]


class Supervised:
    def __init__(
        self,
        tmp_path: Path,
        sim_args: list[str],
        sup_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        port, engine_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        sim = [*SIM, "--port", str(engine_port), "--model", "sim-model"]
        args = ["supervise", "--port", str(port), "--engine-url", f"http://127.0.0.1:{engine_port}"]
        args += ["--model", "sim-model", "--state-dir", str(tmp_path / "state"), "--restart-backoff", "0.1"]
        args += sup_args if sup_args is not None else ["--startup-restarts", "0"]
        self.proc = CorralProcess([*args, "--", *sim, *sim_args], env=env)

    def state(self) -> dict[str, Any]:
        try:
            return dict(httpx.get(self.url + "/v1/state", timeout=5).json())
        except httpx.HTTPError:
            return {}

    def wait_for(self, state: str, timeout: float = 90) -> dict[str, Any]:
        try:
            wait_until(lambda: self.state().get("state") == state, timeout, f"supervisor {state}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last state {self.state()}:\n{self.proc.output()[-3000:]}") from None
        return self.state()


@pytest.fixture
def started() -> Any:
    procs: list[Supervised] = []
    yield procs
    for s in procs:
        s.proc.stop()


def doctor_json(url: str) -> dict[str, Any]:
    proc = CorralProcess(["doctor", "--supervisor", url, "--json"], env={"COLUMNS": "200"})
    proc.wait_exit(90)
    out = proc.output()
    body = orjson.loads(out[out.index("{") :])
    (finding,) = [f for f in body["findings"] if f["engine"] != "router"]
    return dict(finding)


@pytest.mark.parametrize(
    ("fault", "branch", "said", "next_words"),
    [
        (
            "illegal-memory-access",
            "process-dead/cuda-error",
            "CUDA error: an illegal memory access was encountered",
            "CUDA_LAUNCH_BLOCKING=1",
        ),
        (
            "nccl-timeout",
            "process-dead/nccl-timeout",
            "NCCL collective timed out",
            "NCCL_DEBUG=INFO",
        ),
    ],
)
def test_an_engine_dead_of_a_gpu_fault_gets_the_faults_branch_and_next_command(
    started: list[Supervised], tmp_path: Path, fault: str, branch: str, said: str, next_words: str
) -> None:
    s = Supervised(tmp_path, [f"--gpu-fault={fault}"])  # dies at the smoke request
    started.append(s)
    body = s.wait_for("FAILED")
    finding = doctor_json(s.url)
    assert finding["branch"] == branch, finding
    assert next_words in finding["next"], finding
    assert said.split(":")[0] in finding["evidence"] or "Watchdog" in finding["evidence"], finding
    assert said in body["reason"], body["reason"]  # the state reason names the fault
    assert body["gpu_fault"]["kind"] in ("cuda_error", "nccl_timeout"), body["gpu_fault"]


def test_a_driver_xid_in_the_kernel_log_names_the_gpu_and_says_drain_the_node(
    started: list[Supervised], tmp_path: Path
) -> None:
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text(
        "Dec  6 20:00:00 gpu-1 kernel: NVRM: Xid (PCI:0000:17:00): 79, old, before the run\n"
    )
    s = Supervised(
        tmp_path,
        ["--gpu-fault=illegal-memory-access", "--gpu-fault-after=1"],  # smoke passes, the next request dies
        sup_args=["--startup-restarts", "0", "--failure-restarts", "0"],
        env={"CORRAL_KERNEL_LOG": str(kernel_log)},
    )
    started.append(s)
    s.wait_for("READY")
    with kernel_log.open("a") as log:  # the driver's line, as the kernel logs it, after the run started
        log.write(
            "Dec  6 21:00:00 gpu-1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, "
            "GPU has fallen off the bus.\n"
        )
    with pytest.raises(httpx.HTTPError):  # the request that kills it
        httpx.post(
            s.state()["engine"]["url"] + "/v1/completions",
            json={"model": "sim-model", "prompt": "hi", "max_tokens": 1},
            timeout=30,
        )
    s.wait_for("FAILED")
    finding = doctor_json(s.url)
    assert finding["branch"] == "process-dead/gpu-xid", finding
    assert "PCI:0000:3b:00" in finding["evidence"] and "fallen off the bus" in finding["evidence"], finding
    assert "drain the node" in finding["next"] and "nvidia-smi -q" in finding["next"], finding
    body = s.state()
    assert "; GPU driver Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus" in body["reason"], body
    assert body["gpu_fault"]["kind"] == "xid" and body["gpu_fault"]["xid"] == 79, body["gpu_fault"]
    assert body["engine_evidence"]["xid"]["count"] == 1, body["engine_evidence"]  # not the old line
    assert "file" in body["xid_sources"]["sources"], body["xid_sources"]


def test_a_bundle_dead_of_a_cuda_error_names_the_graph_and_nccl_settings_it_changed(tmp_path: Path) -> None:
    port = free_port()
    engine = [*SIM, "--host", "127.0.0.1", "--port", str(port), "--model", "sim-model"]
    main = tmp_path / "main.yaml"  # the new bundle: CUDA graphs on (no --enforce-eager), an NCCL setting
    main.write_text(
        orjson.dumps(
            {
                "name": "main",
                "command": [*engine, "--gpu-fault=illegal-memory-access"],
                "env": {"NCCL_P2P_DISABLE": "1"},
            }
        ).decode()
    )
    sup = start_supervised(
        engine_port=port,
        engine_cmd=[*engine, "--enforce-eager"],  # the stable bundle, serving first
        sup_args=(
            *("--bundle-name", "stable", "--bundle", str(main), "--startup-restarts", "0"),
            *("--propagation-timeout", "3", "--quiet-period", "0.3"),
        ),
    )
    try:
        sup.wait_state("READY", timeout=90)
        status, op = http_json(sup.url + "/v1/bundle", "POST", {"name": "main", "operation_id": "to-main"})
        assert status == 202, op
        op_url = f"{sup.url}/v1/operations/to-main"
        wait_until(lambda: http_json(op_url)[1]["status"] != "running", 120, what="the switch finished")
        # the run of `main` that died is on record with its settings against the stable bundle's, whichever
        # noticed first (the start's own failure, or the switch's rank watch) and whatever RECOVER did since
        (record,) = [r for r in sup.oplog() if r["record"] == "gpu_fault"]
        assert (record["kind"], record["bundle"]) == ("cuda_error", "main"), record
        compared = record["graph_nccl_vs_stable"]
        assert (compared["bundle"], compared["stable_bundle"]) == ("main", "stable"), compared
        assert {c["name"]: (c["here"], c["stable"]) for c in compared["changed"]} == {
            "--enforce-eager": ("(unset)", "on"),
            "NCCL_P2P_DISABLE": ("1", "(unset)"),
        }
        # RECOVER put the stable bundle back; doctor names what it recovered from
        body = sup.wait_state("READY", timeout=90)
        assert body["last_gpu_fault"]["graph_nccl_vs_stable"] == compared, body["last_gpu_fault"]
        finding = doctor_json(sup.url)
        assert finding["branch"] == "gpu-fault/cuda-error", finding
        assert "(bundle main)" in finding["evidence"], finding
        assert (
            "changed from stable bundle stable: --enforce-eager (unset) (stable: on)" in finding["evidence"]
        )
        assert "roll back to stable" in finding["next"], finding
    finally:
        sup.proc.stop()


def test_memory_a_sleep_kept_is_shown_with_the_graph_nccl_settings_changed_from_the_stable_bundle(
    tmp_path: Path,
) -> None:
    port = free_port()
    engine = [*SIM, "--host", "127.0.0.1", "--port", str(port), "--model", "sim-model"]
    engine += ["--weights-gib", "2", "--kv-cache-gib", "4"]  # no --enable-sleep-mode: a sleep frees nothing
    stable = tmp_path / "stable.yaml"  # declared known-good: the rollback bundle
    stable.write_text(orjson.dumps({"name": "stable", "command": [*engine, "--enforce-eager"]}).decode())
    sup = start_supervised(
        engine_port=port,
        engine_cmd=engine,
        sup_args=(
            "--bundle-name",
            "main",
            "--bundle",
            str(stable),
            "--on-startup-failure",
            "rollback=stable",
        ),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    try:
        body = sup.wait_state("READY", timeout=90)
        assert body["graph_nccl_vs_stable"]["changed"] == [
            {"name": "--enforce-eager", "here": "(unset)", "stable": "on"}
        ], body["graph_nccl_vs_stable"]
        assert httpx.post(sup.engine_url + "/sleep", params={"level": 1}, timeout=10).status_code == 200
        finding = doctor_json(sup.url)
        assert finding["branch"] == "memory/not-released", finding
        assert (
            "changed from stable bundle stable: --enforce-eager (unset) (stable: on)" in finding["evidence"]
        )
        assert "roll back to stable" in finding["next"], finding
    finally:
        sup.proc.stop()


def test_a_start_that_loses_its_gpu_is_not_restarted_on_it(started: list[Supervised], tmp_path: Path) -> None:
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    s = Supervised(
        tmp_path,
        ["--gpu-fault=illegal-memory-access", "--startup-seconds=8"],  # dies at the smoke, 8 s after start
        sup_args=["--startup-restarts", "3"],  # restarts left, none to be used
        env={"CORRAL_KERNEL_LOG": str(kernel_log)},
    )
    started.append(s)
    # the engine is launched (its run's kernel log is open) and still loading: the GPU falls off the bus
    wait_until(lambda: s.state().get("sub_state") == "engine_starting", 60, "the engine launched")
    with kernel_log.open("a") as log:
        log.write(
            "[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off "
            "the bus.\n"
        )
    wait_until(lambda: s.state().get("sub_state") == "gave_up", 120, "FAILED for good")
    body = s.state()
    assert "GPU driver Xid 79" in body["reason"] and "not restarted" in body["reason"], body["reason"]
    assert body["restarts"] == [], body["restarts"]  # no restart spent on a GPU that is gone


def test_an_engine_lost_with_its_gpu_is_not_restarted_on_it(
    started: list[Supervised], tmp_path: Path
) -> None:
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    s = Supervised(
        tmp_path,
        ["--gpu-fault=illegal-memory-access", "--gpu-fault-after=1"],
        sup_args=["--startup-restarts", "0", "--failure-restarts", "3"],  # restarts left, none used
        env={"CORRAL_KERNEL_LOG": str(kernel_log)},
    )
    started.append(s)
    engine_url = s.wait_for("READY")["engine"]["url"]
    with kernel_log.open("a") as log:
        log.write(
            "[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off "
            "the bus.\n"
        )
    with pytest.raises(httpx.HTTPError):
        httpx.post(engine_url + "/v1/completions", json={"model": "sim-model", "prompt": "hi"}, timeout=30)
    wait_until(lambda: s.state().get("sub_state") == "gave_up", 90, "FAILED for good")
    body = s.state()
    assert "not restarted: the GPU needs a reset" in body["reason"], body["reason"]
    assert body["restarts"] == [], body["restarts"]  # no restart in place spent on a dead GPU
