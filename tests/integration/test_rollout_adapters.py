"""Adapters follow the fleet: a `corral up` fleet of LoRA-enabled simulators holding a runtime-loaded
adapter is rolled out to a new bundle and the new groups serve that adapter (through the router) and
keep it in their runtime set; a rollout to a bundle that cannot load it fails its START naming the
adapter, with the fleet serving on; and an adapter lost by hand after the rollout makes `corral
verify` fail naming it, until the removal is declared with --allow-adapter-removal."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.integration.test_rollout import corral, fleet_file, read_token, routable, stop_up
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

# the simulators serve LoRA and take runtime loads, as vLLM does with these
ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
LORA = ["--enable-lora", "--max-loras", "2"]
ADAPTER = "adapter-rt"


def start_lora_fleet(state: Path) -> tuple[CorralProcess, str]:
    port = free_port()
    sim = [f"--sim-arg={arg}" for arg in LORA]
    proc = CorralProcess(
        ["up", "--port", str(port), "--engines", "2", *sim], env={"XDG_STATE_HOME": str(state), **ENV}
    )
    wait_until(lambda: "router: " in proc.output() or proc.proc.poll() is not None, 90, "the router URL")
    match = re.search(r"router: (http://\S+)", proc.output())
    # the printed line is the contract: it tells the person where to connect
    assert match, proc.output()
    return proc, match.group(1)


async def supervisor_call(
    session: aiohttp.ClientSession, url: str, token: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A GET, or an operation POSTed and followed to its end."""
    headers = {"Authorization": f"Bearer {token}"}
    if body is None:
        async with session.get(url + path, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            answer: dict[str, Any] = await resp.json()
            return answer
    async with session.post(url + path, json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        op_id = (await resp.json())["operation_id"]
    for _ in range(600):  # 60 s at most
        async with session.get(f"{url}/v1/operations/{op_id}", headers=headers) as resp:
            op: dict[str, Any] = await resp.json()
        if op["status"] != "running":
            return op
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} on {url} still running: {op}")


async def ask_adapter(session: aiohttp.ClientSession, router: str) -> tuple[int, str]:
    body = {"model": ADAPTER, "prompt": "hello adapter", "max_tokens": 4}
    async with session.post(router + "/v1/completions", json=body) as resp:
        return resp.status, await resp.text()


async def test_a_rollout_carries_a_runtime_adapter_and_verify_names_one_lost(tmp_path: Path) -> None:
    state = tmp_path / "state"
    adapter_dir = tmp_path / ADAPTER
    adapter_dir.mkdir()
    proc, url = start_lora_fleet(state)
    port = url.rsplit(":", 1)[1]
    try:
        fleet = fleet_file(state, url)
        token = read_token(fleet, "supervisor_token_file")
        old = {e["engine"] for e in fleet["engines"]}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for e in fleet["engines"]:
                op = await supervisor_call(
                    session,
                    e["supervisor"],
                    token,
                    "/v1/lora/load",
                    {"name": ADAPTER, "path": str(adapter_dir)},
                )
                assert op["status"] == "succeeded", op
            for _ in range(150):  # the router reads each engine's models every second
                if (await ask_adapter(session, url))[0] == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(
                    f"the router does not route {ADAPTER}: {await ask_adapter(session, url)}"
                )

            bundle = tmp_path / "v2.yaml"
            bundle.write_text(
                orjson.dumps({"name": "v2", "engine_args": [*LORA, "--version-string", "0.33.1"]}).decode()
            )
            code, output = await corral(
                state, "rollout", "--port", port, "--to", str(bundle), "--max-surge", "2"
            )
            assert code == 0, output
            record = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
            assert record["adapters"] == {"carried": {ADAPTER: str(adapter_dir)}, "served": [ADAPTER]}
            verified = [s for s in record["steps"] if s["step"] == "VERIFY"]
            assert len(verified) == 2 and all(s["data"]["adapters"] == [ADAPTER] for s in verified)

            after = fleet_file(state, url)
            assert not old & {e["engine"] for e in after["engines"]}  # every engine is new
            assert await routable(url) == {e["engine"] for e in after["engines"]}
            for e in after["engines"]:
                body = await supervisor_call(session, e["supervisor"], token, "/v1/state")
                # a runtime adapter on the new supervisor too: it outlives that supervisor's restarts
                assert body["adapters"]["runtime"] == [ADAPTER], body["adapters"]
                assert body["adapters"]["served"] == [ADAPTER], body["adapters"]
            status, text = await ask_adapter(session, url)
            assert status == 200, text
            assert orjson.loads(text)["model"] == ADAPTER

            # a bundle whose engines cannot serve LoRA: its START fails naming the adapter, and the
            # fleet keeps serving on v2 with the adapter
            bad = tmp_path / "v3.yaml"
            bad.write_text(
                orjson.dumps({"name": "v3", "engine_args": ["--version-string", "0.34.0"]}).decode()
            )
            code, output = await corral(
                state, "rollout", "--port", port, "--to", str(bad), "--max-surge", "2"
            )
            assert code == 1, output
            failed = orjson.loads((state / "corral" / f"rollout-{port}.json").read_bytes())
            assert failed["outcome"] == "failed" and failed["reason"].startswith("START"), failed["reason"]
            assert f"adapter {ADAPTER!r}" in failed["reason"], failed["reason"]
            assert {e["engine"] for e in fleet_file(state, url)["engines"]} == {
                e["engine"] for e in after["engines"]
            }
            status, text = await ask_adapter(session, url)
            assert status == 200, text

            code, output = await corral(state, "verify", "--port", port)
            assert code == 0, output

            # lost by hand on every engine: the fleet is uniform again, but without the adapter
            for e in after["engines"]:
                op = await supervisor_call(
                    session, e["supervisor"], token, "/v1/lora/unload", {"name": ADAPTER}
                )
                assert op["status"] == "succeeded", op
            code, output = await corral(state, "verify", "--port", port)
            assert code == 1, output
            checks = {
                c["check"]: c
                for c in orjson.loads((state / "corral" / f"verify-{port}.json").read_bytes())["checks"]
            }
            assert checks["adapters"]["verdict"] == "pass", checks["adapters"]  # what verify saw before
            assert checks["adapters_kept"]["verdict"] == "fail"
            assert f"adapter {ADAPTER!r} not served by" in checks["adapters_kept"]["detail"]
            # the failed record keeps the loss: a second look still fails
            code, output = await corral(state, "verify", "--port", port)
            assert code == 1 and "adapters_kept" in output, output
            code, output = await corral(state, "verify", "--port", port, "--allow-adapter-removal", ADAPTER)
            assert code == 0, output
            code, output = await corral(state, "verify", "--port", port)
            assert code == 0, output
    finally:
        stop_up(proc)
