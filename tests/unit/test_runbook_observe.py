"""OBSERVE: the request fields and their 400 messages, the template running it after POSTCHECK (a failed
window fails the operation, RECOVER only where the observer says so), and `ObservedWindow` against a
real HTTP `/metrics` whose figures move between readings: the window is the difference, judged against
the PRECHECK baseline; an engine that is not READY has nothing to observe."""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from corral.contracts.operations import ReloadRequest, SleepRequest, SwitchBundleRequest, WakeRequest
from corral.contracts.traffic import WindowThresholds
from corral.supervisor.lifecycle.states import EngineState
from corral.supervisor.runbook.engine_access import EngineAccess
from corral.supervisor.runbook.observe import ObservedWindow
from corral.supervisor.runbook.template import OperationFailed, Runbook, Step, StepFailed
from tests.unit.test_runbook import Plan


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"observe_seconds": -1}, "observe_seconds must be seconds (0: no OBSERVE) from 0 to 3600, not -1"),
        ({"observe_seconds": 4000}, "from 0 to 3600, not 4000"),
        ({"observe_seconds": "10"}, "observe_seconds must be a number, not '10'"),
        ({"observe_seconds": True}, "observe_seconds must be a number, not True"),
        ({"max_error_ratio": 1.5}, "max_error_ratio must be an error ratio from 0 to 1, not 1.5"),
        ({"max_ttft_ratio": 0.5}, "max_ttft_ratio must be how many times the baseline's TTFT p99 from 1"),
        ({"max_itl_ratio": 0.5}, "max_itl_ratio must be how many times the baseline's ITL p99 from 1"),
        ({"max_itl_ratio": "2"}, "max_itl_ratio must be a number, not '2'"),
        ({"min_requests": 0}, "min_requests must be a whole number of requests, at least 1, not 0"),
    ],
)
def test_bad_observe_fields_are_refused_with_what_to_send(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        WakeRequest.model_validate(body)


def test_every_runbook_request_carries_the_window_and_its_thresholds() -> None:
    asked = SwitchBundleRequest.model_validate({"name": "b", "observe_seconds": 30, "max_error_ratio": 0.1})
    assert asked.observe_seconds == 30.0
    assert asked.thresholds() == WindowThresholds(max_error_ratio=0.1)
    assert WakeRequest(observe_seconds=5, max_itl_ratio=3).thresholds() == WindowThresholds(max_itl_ratio=3.0)
    assert ReloadRequest(observe_seconds=5, min_requests=3).body() == {
        "mode": "wait",
        "observe_seconds": 5.0,
        "min_requests": 3,
    }
    assert SleepRequest().body() == {"level": 1, "mode": "wait", "release_kv": False}  # nothing asked


class Observer:
    def __init__(self, fails: bool, recovers: bool) -> None:
        self.fails = fails
        self.recovers = recovers

    async def baseline(self) -> dict[str, Any]:
        return {"baseline": None}

    async def observe(self) -> dict[str, Any]:
        if self.fails:
            raise StepFailed("the observed window failed: error ratio 0.300", verdict={"verdict": "failed"})
        return {"verdict": {"verdict": "passed"}}


def _runbook(plan: Plan, observer: Observer) -> tuple[Runbook, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    book = Runbook(plan, "op-1", lambda kind, /, **f: records.append(f), lambda _: None, observer)
    return book, records


async def test_observe_runs_after_postcheck() -> None:
    plan = Plan()
    book, records = _runbook(plan, Observer(fails=False, recovers=False))
    result = await book.run({})
    assert [s["step"] for s in result["steps"]][-2:] == ["postcheck", "observe"]
    assert records[-1]["evidence"] == {"verdict": {"verdict": "passed"}}


async def test_a_failed_window_fails_the_operation_and_recovers_only_where_asked() -> None:
    plan = Plan()
    book, records = _runbook(plan, Observer(fails=True, recovers=False))
    with pytest.raises(StepFailed, match=r"error ratio 0\.300"):
        await book.run({})
    assert records[-1]["step"] == "observe" and records[-1]["status"] == "failed"
    assert records[-1]["evidence"]["verdict"] == {"verdict": "failed"}
    assert not any(c.startswith("recover") for c in plan.calls)

    plan = Plan()
    book, records = _runbook(plan, Observer(fails=True, recovers=True))
    with pytest.raises(OperationFailed) as failed:
        await book.run({})
    assert failed.value.step is Step.OBSERVE and "error ratio 0.300" in str(failed.value)
    assert plan.calls[-1] == "recover:observe"
    assert [r["step"] for r in records][-2:] == ["observe", "recover"]


class Engine:
    """A `/metrics` whose counters move by 10 requests (`errors_each` of them errors) per reading."""

    def __init__(self, errors_each: int) -> None:
        self.errors_each = errors_each
        self.readings = 0
        self.slow_itl = 0  # ITLs of 0.25 s so far (the others are within 0.05 s)
        self.slow_each = 0
        self.waiting = 1.0

    async def metrics(self, _: web.Request) -> web.Response:
        self.readings += 1
        n, errors = 10 * self.readings, self.errors_each * self.readings
        lines = [
            f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {n - errors}',
            f'vllm:request_success_total{{engine="0",finished_reason="error",model_name="m"}} {errors}',
        ]
        self.slow_itl += self.slow_each
        for name, slow in (
            ("vllm:time_to_first_token_seconds", 0),
            ("vllm:inter_token_latency_seconds", self.slow_itl),
        ):
            lines.append(f'{name}_bucket{{engine="0",le="0.05",model_name="m"}} {n - errors}')
            lines.append(f'{name}_bucket{{engine="0",le="0.25",model_name="m"}} {n - errors + slow}')
            lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {n - errors + slow}')
            lines.append(f'{name}_sum{{engine="0",model_name="m"}} {0.02 * (n - errors) + 0.25 * slow}')
        lines.append(f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {self.waiting}')
        lines.append('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2')
        return web.Response(text="\n".join(lines) + "\n")


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []

    async def start(engine: Engine) -> str:
        app = web.Application()
        app.router.add_get("/metrics", engine.metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def supervised(url: str, session: aiohttp.ClientSession, state: EngineState) -> EngineAccess:
    identity = SimpleNamespace(create_time=time.time() - 60)
    return cast(
        EngineAccess,
        SimpleNamespace(
            session=session,
            config=SimpleNamespace(engine_url=url, engine_env=()),
            machine=SimpleNamespace(state=state),
            # a process that holds no GPU memory: NVML (where there is one) attributes it none
            engine=SimpleNamespace(
                identity=identity, running=True, pid=os.getpid(), ranks=SimpleNamespace(survivors=list)
            ),
            log=lambda _: None,
        ),
    )


async def test_a_window_with_errors_fails_against_a_clean_baseline_naming_the_ratio(serve: Any) -> None:
    engine = Engine(errors_each=0)
    async with aiohttp.ClientSession() as session:
        sup = supervised(await serve(engine), session, EngineState.READY)
        window = ObservedWindow(sup, "switch_bundle", 0.3, WindowThresholds(min_requests=5))
        assert window.recovers
        baseline = await window.baseline()
        assert baseline["baseline"]["requests"] == 10 and baseline["baseline"]["seconds"] >= 60
        engine.errors_each = 3  # the engine after the change fails 3 requests in 10
        with pytest.raises(StepFailed, match=r"error ratio 0\.300 \(\d+/\d+\) against 0\.000") as failed:
            await window.observe()
        evidence = failed.value.evidence
        assert evidence["verdict"]["verdict"] == "failed" and evidence["baseline"]["requests"] == 10
        assert evidence["window"]["source"] == "engine_metrics" and evidence["window"]["requests"] >= 10


async def test_a_healthy_window_passes_and_a_sleeping_engine_is_not_applicable(serve: Any) -> None:
    engine = Engine(errors_each=0)
    async with aiohttp.ClientSession() as session:
        url = await serve(engine)
        window = ObservedWindow(
            supervised(url, session, EngineState.READY), "wake", 0.3, WindowThresholds(min_requests=5)
        )
        assert not window.recovers
        await window.baseline()
        evidence = await window.observe()
        assert evidence["verdict"]["verdict"] == "passed", evidence
        assert evidence["window"]["ttft_p50_ms"] is not None and evidence["window"]["errors"] == 0

        asleep = ObservedWindow(
            supervised(url, session, EngineState.SLEEPING), "sleep", 0.3, WindowThresholds()
        )
        readings = engine.readings
        evidence = await asleep.observe()
        assert evidence["verdict"] is None and "SLEEPING after the sleep" in evidence["not_applicable"]
        assert engine.readings == readings  # nothing was read: there is nothing to judge


async def test_a_window_whose_itl_grew_fails_naming_it_and_gpu_memory_is_not_measured_here(
    serve: Any,
) -> None:
    """The ITL p99 from the engine's own histogram against the baseline's, and the gauges read over the
    window; this test process holds no GPU memory, so that figure is not measured (and says why)."""
    engine = Engine(errors_each=0)
    async with aiohttp.ClientSession() as session:
        sup = supervised(await serve(engine), session, EngineState.READY)
        window = ObservedWindow(sup, "reload", 1.2, WindowThresholds(min_requests=5))
        baseline = (await window.baseline())["baseline"]
        assert (
            baseline["itl_p99_ms"] <= 50 and baseline["queue_waiting"] == 1.0 and baseline["kv_usage"] == 0.2
        )
        engine.slow_each, engine.waiting = 20, 2.0  # two slow gaps for every request after the change
        with pytest.raises(
            StepFailed, match=r"ITL p99 \d+(\.\d+)? ms against \d+(\.\d+)? ms for the baseline"
        ) as failed:
            await window.observe()
        evidence = failed.value.evidence
        figures = {f["figure"]: f for f in evidence["verdict"]["figures"]}
        assert figures["itl_p99_ms"]["outcome"] == "failed" and figures["itl_p99_ms"]["observed"] > 200
        assert figures["queue_waiting"]["outcome"] == "passed" and figures["queue_waiting"]["observed"] == 2.0
        assert figures["kv_usage"] == {
            **figures["kv_usage"],
            "outcome": "passed",
            "observed": 0.2,
            "baseline": 0.2,
        }
        assert figures["gpu_memory_gib"]["outcome"] == "not_measured", figures["gpu_memory_gib"]
        assert "not measured" in figures["gpu_memory_gib"]["reason"]
        assert evidence["window"]["gauge_readings"] >= 2  # read over the window, not once
