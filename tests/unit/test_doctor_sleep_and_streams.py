"""`corral doctor`'s partial-wake, memory-not-released and aborted-streams branches, from captured
supervisor states, engine metrics and router metrics; and the router's reading of how a stream ended."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from corral.contracts.router import FleetEndpoint
from corral.engine.stream_ending import CUT, ENGINE_ABORT, ENGINE_ERROR, StreamEnding
from corral.fleet.checks.doctor import diagnose, diagnose_engine
from corral.fleet.checks.doctor_sleep import MEMORY_NOT_RELEASED, PARTIAL_WAKE
from corral.fleet.checks.doctor_streams import ABORTED_STREAMS
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.router.telemetry.metrics import RouterCollector, RouterMetrics

GIB = 2**30


def engine_metrics(sleep_state: str, weights_gib: float, kv_gib: float, aborted: int = 0) -> str:
    lines = [
        f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="{s}"}} '
        f"{1.0 if s == sleep_state else 0.0}"
        for s in ("awake", "weights_offloaded", "discard_all")
    ]
    lines += [
        f'corral_sim_gpu_memory_bytes{{kind="weights"}} {weights_gib * GIB}',
        f'corral_sim_gpu_memory_bytes{{kind="kv_cache"}} {kv_gib * GIB}',
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="m"}} {aborted}.0',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0',
    ]
    return "\n".join(lines) + "\n"


def sleeping_engine(state: dict[str, Any] | None, metrics: str, supervised: bool = True) -> EngineView:
    return EngineView(
        "e0",
        "http://sup" if supervised else None,
        "http://eng",
        state=state,
        health=200,
        sleeping=True,
        models=[{"id": "m"}],
        metrics=metrics,
    )


def diagnosis(view: EngineView) -> tuple[str, str, str]:
    found = asyncio.run(diagnose_engine(view, 0.1))
    return found.branch, found.evidence, found.next_command


BEFORE = {"gpu_weights_bytes": 2.0 * GIB, "gpu_kv_cache_bytes": 4.0 * GIB}


def test_partial_wake_from_the_supervisor_names_the_tags_left_and_the_wake_that_completes() -> None:
    state = {
        "state": "SLEEPING",
        "sub_state": "partially_awake",
        "sleep": {"level": 1, "woken_tags": ["weights"], "asleep_tags": ["kv_cache"], "before": BEFORE},
    }
    branch, evidence, command = diagnosis(sleeping_engine(state, engine_metrics("weights_offloaded", 2, 0)))
    assert branch == PARTIAL_WAKE
    assert "['weights'] woken" in evidence and "['kv_cache'] still asleep" in evidence
    assert command.startswith("finish the wake: corral wake --supervisor http://sup --tags kv_cache")


def test_partial_wake_of_level_2_weights_still_asleep_needs_reload() -> None:
    state = {
        "state": "SLEEPING",
        "sub_state": "partially_awake",
        "sleep": {"level": 2, "woken_tags": ["kv_cache"], "asleep_tags": ["weights"]},
    }
    _, _, command = diagnosis(sleeping_engine(state, engine_metrics("discard_all", 0, 4)))
    assert "--tags weights --reload" in command


def test_partial_wake_seen_on_the_engine_alone() -> None:
    branch, evidence, command = diagnosis(
        sleeping_engine(None, engine_metrics("weights_offloaded", 2, 0), supervised=False)
    )
    assert branch == PARTIAL_WAKE and "kv_cache still asleep" in evidence
    assert command.startswith("run the engine under `corral supervise`") and "--tags kv_cache" in command
    assert "curl" not in command  # doctor's next step is always a Corral command


def test_memory_not_released_compares_with_the_figures_before_the_sleep() -> None:
    state = {"state": "SLEEPING", "sub_state": "level_1", "sleep": {"level": 1, "before": BEFORE}}
    branch, evidence, command = diagnosis(sleeping_engine(state, engine_metrics("weights_offloaded", 2, 4)))
    assert branch == MEMORY_NOT_RELEASED
    assert "still holding weights 2.00 GiB, KV cache 4.00 GiB" in evidence
    assert "before the sleep: weights 2.00 GiB, KV cache 4.00 GiB" in evidence
    assert "--enable-sleep-mode" in command and "nvidia-smi" in command


def test_a_kv_release_that_kept_the_kv_cache_is_memory_not_released() -> None:
    state = {"state": "SLEEPING", "sleep": {"level": 0, "kv_released": True}}
    branch, evidence, _ = diagnosis(sleeping_engine(state, engine_metrics("awake", 2, 4)))
    assert branch == MEMORY_NOT_RELEASED and "KV cache 4.00 GiB" in evidence and "weights" not in evidence


def test_a_sleep_that_freed_its_memory_is_plain_sleeping() -> None:
    state = {"state": "SLEEPING", "sub_state": "level_1", "sleep": {"level": 1, "before": BEFORE}}
    branch, _, _ = diagnosis(sleeping_engine(state, engine_metrics("weights_offloaded", 0, 0)))
    assert branch == "not-ready/sleeping"


def router_metrics(failures: dict[tuple[str, str], int]) -> str:
    metrics = RouterMetrics()
    for (model, how), n in failures.items():
        for _ in range(n):
            metrics.count_stream_failure(model, how, tokens_emitted=True)
    registry = CollectorRegistry()
    registry.register(RouterCollector(metrics, list))
    return generate_latest(registry).decode()


def fleet(router_text: str, engine_text: str) -> FleetView:
    engine = EngineView(
        "engine-0", None, "http://eng", health=200, sleeping=False, models=[{"id": "m"}], metrics=engine_text
    )
    return FleetView(
        FleetTarget("http://router", []),
        engines=[engine],
        router_endpoints=[FleetEndpoint(url="http://eng", routable=True)],
        router_metrics=router_text,
    )


def router_branches(view: FleetView) -> list[tuple[str, str, str]]:
    found = asyncio.run(diagnose(view, 0.1))
    return [(d.branch, d.evidence, d.next_command) for d in found if d.engine == "router"]


def test_aborted_streams_from_the_router_and_the_engines_counts() -> None:
    text = router_metrics({("m", ENGINE_ABORT): 3, ("m", CUT): 1})
    view = fleet(text, engine_metrics("awake", 2, 4, aborted=3))
    view.engines[0].sleeping = False
    ((branch, evidence, command),) = router_branches(view)
    assert branch == ABORTED_STREAMS
    assert "engine_abort×3 (model m)" in evidence and "cut×1 (model m)" in evidence
    assert "engine-0: abort×3" in evidence
    assert "mode abort" in command


def test_streams_ended_by_engine_errors_point_at_the_engine_log() -> None:
    view = fleet(router_metrics({("m", ENGINE_ERROR): 2}), "")
    ((branch, _, command),) = router_branches(view)
    assert branch == ABORTED_STREAMS and "corral logs --engine" in command


def test_no_stream_failures_no_branch() -> None:
    # the router's row only, healthy (issue 32: doctor always has one)
    assert [branch for branch, _, _ in router_branches(fleet(router_metrics({}), ""))] == ["healthy"]


def test_stream_ending_sees_markers_split_across_chunks() -> None:
    normal = StreamEnding()
    normal.feed(b'data: {"choices":[{"finish_reason":"length"}]}\n\n')
    normal.feed(b"data: [DONE]\n\n")
    assert normal.failure is None
    aborted = StreamEnding()
    aborted.feed(b'data: {"choices":[{"text":"x","finish_rea')
    aborted.feed(b'son":"abort"}]}\n\ndata: [DONE]\n\n')
    assert aborted.failure == ENGINE_ABORT
    failed = StreamEnding()
    failed.feed(b'data: {"choices":[{"finish_reason":"abort"}]}\n\ndata: {"err')
    failed.feed(b'or":{"message":"boom"}}\n\n')
    assert failed.failure == ENGINE_ERROR
    dribbled = StreamEnding()  # one byte per chunk: the seam spans many chunks
    for byte in b'data: {"choices":[{"finish_reason":"abort"}]}\n\n':
        dribbled.feed(bytes([byte]))
    assert dribbled.failure == ENGINE_ABORT
    quoted = StreamEnding()  # a token that looks like the marker is escaped inside the JSON string
    quoted.feed(b'data: {"choices":[{"text":"data: {\\"error\\""}]}\n\n')
    assert quoted.failure is None
