"""An engine that demands an API key (`--api-key KEY` in its command, or VLLM_API_KEY in its environment):
the supervisor's readiness checks, smoke completion and runbook calls carry the key, so the engine reaches
READY and sleeps and wakes; the key never shows in the supervisor's output, its operation log, `/v1/state`
or an operation's result. Real `corral supervise` over `corral sim` enforcing the key, on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.procs import free_port

KEY = "sk-engine-0d9e41c7"
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SIM_ARGS = ("--enable-sleep-mode", "--weights-gib", "2", "--kv-cache-gib", "4", "--itl-ms", "5")
SUP_ARGS = ("--propagation-timeout", "1", "--quiet-period", "0.2")


def run_op(sup: Supervised, path: str, body: dict[str, object]) -> dict[str, object]:
    status, op = http_json(sup.url + path, "POST", body)
    assert status == 202, op
    final = sup.wait_for(
        f"{path} finished",
        lambda b: any(
            o["operation_id"] == op["operation_id"] and o["status"] != "running" for o in b["operations"]
        ),
        30,
    )
    (done,) = [o for o in final["operations"] if o["operation_id"] == op["operation_id"]]
    return done


def assert_key_never_shown(sup: Supervised) -> None:
    shown = {
        "supervisor output": sup.proc.output(),
        "operation log": (sup.state_dir / "oplog.jsonl").read_text(),
        "/v1/state": json.dumps(sup.state()),
    }
    for where, text in shown.items():
        assert KEY not in text, f"the engine's API key shows in the {where}"


def test_an_engine_with_api_key_in_its_command_becomes_ready_and_sleeps_and_wakes() -> None:
    with supervised(sim_args=(*SIM_ARGS, "--api-key", KEY), sup_args=SUP_ARGS, env=DEV) as sup:
        # on an unkeyed supervisor this stays STARTING/smoke_testing: GET /v1/models answers 401
        sup.wait_state("READY", timeout=30)
        engine = sup.engine_url
        assert httpx.get(engine + "/v1/models").status_code == 401  # the engine does enforce the key
        assert run_op(sup, "/v1/sleep", {"level": 1, "mode": "wait"})["status"] == "succeeded"
        assert httpx.get(engine + "/is_sleeping").json() == {"is_sleeping": True}
        woke = run_op(sup, "/v1/wake", {"operation_id": "wake-keyed"})
        assert woke["status"] == "succeeded", woke
        sup.wait_state("READY", timeout=30)
        state = sup.state()
        assert "<redacted>" in state["engine"]["argv"] and KEY not in state["engine"]["argv"]
        # the engine printed its key among its args; the supervisor relayed the line masked
        # the log is the contract here: no secret ever reaches it
        assert "'api_key': ['<redacted>']" in sup.proc.output()
        assert_key_never_shown(sup)


def test_an_engine_keyed_by_its_environment_becomes_ready_and_its_adapter_loads(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter-a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    env = {"VLLM_API_KEY": KEY, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    gate = f"http://127.0.0.1:{free_port()}"
    gate_args = ("--gate-port", gate.rsplit(":", 1)[1], "--gate-host", "127.0.0.1")
    with supervised(
        sim_args=("--enable-lora", "--max-loras", "2"), sup_args=(*SUP_ARGS, *gate_args), env=env
    ) as sup:
        sup.wait_state("READY", timeout=30)
        assert httpx.get(sup.engine_url + "/v1/models").status_code == 401
        # the admission gate adds no key of its own: a client is let through to the engine only with the key
        assert httpx.get(gate + "/v1/models").status_code == 401
        assert httpx.get(gate + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        # POST /v1/load_lora_adapter is under the engine's guarded /v1 too
        op = run_op(sup, "/v1/lora/load", {"name": "adapter-a", "path": str(adapter)})
        assert op["status"] == "succeeded", op
        models = httpx.get(sup.engine_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert "adapter-a" in [m["id"] for m in models["data"]]
        assert_key_never_shown(sup)
