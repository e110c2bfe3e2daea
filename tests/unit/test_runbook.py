"""The runbook template (every step in order, RECOVER on a failure, nothing after it) and the pure
readers the operations use: sleep/memory figures, LoRA adapters in flight, the zero-copy check."""

from __future__ import annotations

from typing import Any

import pytest

from corral.engine.dev_api import parse_figures
from corral.supervisor.checks.adapters import AdapterSpecError, lora_in_flight, parse_lora
from corral.supervisor.runbook.common import zero_copy_preload
from corral.supervisor.runbook.template import OperationFailed, Runbook, Step, StepFailed


class Plan:
    kind = "test"

    def __init__(self, fail_at: Step | None = None) -> None:
        self.fail_at = fail_at
        self.calls: list[str] = []

    async def _run(self, step: Step) -> dict[str, Any]:
        self.calls.append(step.value)
        if step is self.fail_at:
            raise StepFailed(f"{step} broke", seen=1)
        return {"ok": step.value}

    async def precheck(self) -> dict[str, Any]:
        return await self._run(Step.PRECHECK)

    async def remove_from_routing(self) -> dict[str, Any]:
        return await self._run(Step.REMOVE_FROM_ROUTING)

    async def drain(self) -> dict[str, Any]:
        return await self._run(Step.DRAIN_POLICY)

    async def execute(self) -> dict[str, Any]:
        return await self._run(Step.EXECUTE)

    async def verify(self) -> dict[str, Any]:
        return await self._run(Step.VERIFY)

    async def recover(self, failed_step: Step, cause: str) -> dict[str, Any]:
        self.calls.append(f"recover:{failed_step}")
        return {"outcome": "back to READY"}

    async def postcheck(self) -> dict[str, Any]:
        return await self._run(Step.POSTCHECK)


def _runbook(plan: Plan) -> tuple[Runbook, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    return Runbook(
        plan, "op-1", lambda record_type, /, **f: records.append({"record": record_type, **f}), lambda _: None
    ), records


async def test_every_step_runs_in_order_and_is_recorded() -> None:
    plan = Plan()
    book, records = _runbook(plan)
    result = await book.run({"checked": True})
    order = ["precheck", "remove_from_routing", "drain_policy", "execute", "verify", "postcheck"]
    assert [r["step"] for r in records] == order
    assert all(r["status"] == "done" and r["operation_id"] == "op-1" for r in records)
    assert records[0]["evidence"] == {"checked": True}  # PRECHECK ran before the operation started
    assert plan.calls == order[1:]
    assert [s["step"] for s in result["steps"]] == order


@pytest.mark.parametrize("fail_at", [Step.REMOVE_FROM_ROUTING, Step.DRAIN_POLICY, Step.EXECUTE, Step.VERIFY])
async def test_a_failed_step_runs_recover_and_nothing_after(fail_at: Step) -> None:
    plan = Plan(fail_at)
    book, records = _runbook(plan)
    with pytest.raises(OperationFailed) as failed:
        await book.run({})
    assert failed.value.step is fail_at and f"failed at {fail_at}" in str(failed.value)
    assert records[-2]["step"] == fail_at.value and records[-2]["status"] == "failed"
    assert records[-2]["evidence"]["seen"] == 1
    assert records[-1]["step"] == "recover" and records[-1]["evidence"]["failed_step"] == fail_at.value
    assert plan.calls[-1] == f"recover:{fail_at}"
    assert "postcheck" not in plan.calls


def test_figures_from_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:engine_sleep_state gauge",
            'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0',
            'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 1.0',
            'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0',
            "# TYPE corral_sim_gpu_memory_bytes gauge",
            'corral_sim_gpu_memory_bytes{kind="weights"} 0.0',
            'corral_sim_gpu_memory_bytes{kind="kv_cache"} 0.0',
            "# TYPE corral_sim_cpu_backup_bytes gauge",
            "corral_sim_cpu_backup_bytes 2048.0",
        ]
    )
    figures = parse_figures(text + "\n")
    assert figures.sleep_state == "weights_offloaded"
    assert (figures.gpu_weights_bytes, figures.gpu_kv_cache_bytes, figures.cpu_backup_bytes) == (0, 0, 2048)
    assert parse_figures("").sleep_state is None


def test_lora_in_flight_reads_the_latest_series() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:lora_requests_info gauge",
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 100.0',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters="c"} 200.0',
        ]
    )
    assert lora_in_flight(text + "\n") == {"c"}
    assert lora_in_flight("") is None


def test_lora_spec_and_zero_copy() -> None:
    assert parse_lora("sql=/adapters/sql") == ("sql", "/adapters/sql")
    with pytest.raises(AdapterSpecError):
        parse_lora("sql")
    assert zero_copy_preload(["vllm", "serve", "m", "--load-format", "ipc_cache"])
    assert not zero_copy_preload(
        ["--load-format", "ipc_cache", "--model-loader-extra-config", '{"mode": "copy"}']
    )
    assert not zero_copy_preload(["vllm", "serve", "m"])
