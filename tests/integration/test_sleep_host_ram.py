"""A level-1 sleep's PRECHECK on host memory, against `corral sim` configured as vLLM is (no memory
figures: `--no-memory-metrics`): the weights' size comes from the model directory's safetensors files
(the startup PRECHECK's memory budget), the host's room narrowed by one more cgroup directory whose
files the test writes (`CORRAL_MEMORY_CGROUP`, cgroup v2 files). A backup that does not fit is refused
with 409 before anything moved (READY, routable, the engine awake, no step past PRECHECK); once the
cgroup has room, the same sleep proceeds and its evidence names both figures. Real processes on
loopback."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_supervisor_partial_wake import call, run_op, step_evidence
from tests.integration.test_supervisor_sleep_ops import DEV
from tests.integration.test_supervisor_support import http_json, sim_command, supervised
from tests.support.model_dirs import GIB, make_model_dir
from tests.support.procs import free_port

MIB = 1 << 20
WEIGHTS = 1 * GIB
LIMIT = 2 * GIB


def fake_cgroup(path: Path, current: int) -> Path:
    """A cgroup v2 directory: a 2 GiB limit, `current` bytes used, no reclaimable page cache."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "memory.max").write_text(f"{LIMIT}\n")
    (path / "memory.current").write_text(f"{current}\n")
    (path / "memory.stat").write_text("anon 0\nfile 0\ninactive_file 0\nactive_file 0\n")
    return path


def test_a_level_1_sleep_whose_backup_does_not_fit_is_refused_before_anything_moves(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "model", weights_bytes=WEIGHTS)
    cgroup = fake_cgroup(tmp_path / "cgroup", current=LIMIT - 512 * MIB)  # 0.5 GiB of room
    engine_port = free_port()
    engine = sim_command(engine_port, "--enable-sleep-mode", "--no-memory-metrics", model=str(model))
    sup_args = ("--propagation-timeout", "3", "--quiet-period", "0.3")
    env = {**DEV, "CORRAL_MEMORY_CGROUP": str(cgroup)}
    with supervised(engine_port=engine_port, engine_cmd=engine, sup_args=sup_args, env=env) as s:
        s.wait_state("READY", 60)
        assert s.state()["memory"]["last"]["source"] is None  # like vLLM: the engine reports no memory

        status, body = call(s, "/v1/sleep", {"level": 1, "mode": "wait"})
        assert status == 409, body
        message = body["error"]["message"]
        assert "sleep level 1 refused" in message and "1.00 GiB of host memory" in message, message
        assert "*.safetensors" in message and "0.50 GiB is available" in message, message
        assert f"cgroup {cgroup}" in message, message
        # nothing half-done: READY and serving, the engine awake, no operation step past PRECHECK
        state = s.state()
        assert state["state"] == "READY" and state["sleep"] is None, state
        assert s.probe("/readyz")[0] == 200
        assert http_json(f"http://127.0.0.1:{engine_port}/is_sleeping")[1] == {"is_sleeping": False}
        steps = [r["step"] for r in s.oplog() if r["record"] == "runbook_step"]
        assert "remove_from_routing" not in steps and "execute" not in steps, steps

        fake_cgroup(cgroup, current=256 * MIB)  # room again: 1.75 GiB
        op = run_op(s, "/v1/sleep", {"level": 1, "mode": "wait"})
        assert op["status"] == "succeeded", op
        host_ram = step_evidence(s, op["operation_id"], "precheck")["host_ram"]
        assert host_ram["outcome"] == "passed", host_ram
        assert host_ram["backup"]["weights_bytes"] == WEIGHTS
        assert host_ram["backup"]["source"] == "precheck_budget"
        (ours,) = [c for c in host_ram["host"]["cgroups"] if c["cgroup"] == str(cgroup)]
        assert ours == {
            "cgroup": str(cgroup),
            "version": 2,
            "limit_bytes": LIMIT,
            "working_set_bytes": 256 * MIB,
            "available_bytes": LIMIT - 256 * MIB,
        }
        assert host_ram["host"]["available_bytes"] <= LIMIT - 256 * MIB
        s.wait_state("SLEEPING")
