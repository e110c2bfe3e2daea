"""A runbook operation's change record assembled from its steps and the two readings of the engine:
timed steps, memory before/after per pool (a side not read is None and named), forced exits None
without a gate and listed with one, warmup apart from the OBSERVE window, the gate's counters as the
request failures, and the rollback command each kind leaves; and a drain's record from its report."""

from __future__ import annotations

from typing import Any

from corral.contracts.records import ChangeRecord
from corral.contracts.traffic import (
    RequestCounts,
    TrafficFigures,
    WindowSummary,
    WindowThresholds,
    compare_windows,
)
from corral.engine_state import EngineState
from corral.supervisor.http.admission import NOT_READY, AdmissionGate
from corral.supervisor.lifecycle.drain import DrainReport
from corral.supervisor.lifecycle.drain_record import drain_change_record
from corral.supervisor.lifecycle.forced_exits import FORCED_EXITS_LISTED
from corral.supervisor.lifecycle.operations import Operation as LedgerOperation
from corral.supervisor.runbook.change_record import (
    FAILED,
    REFUSED,
    SUCCEEDED,
    EngineReading,
    MemoryReading,
    Operation,
    assemble,
    management_url,
)

GIB = 2**30
ENGINE = "http://127.0.0.1:8000"
SUP = "http://127.0.0.1:8081"
BUNDLE = {"name": "initial", "fingerprint": "abc"}


def reading(at: float = 100.0, **changes: Any) -> EngineReading:
    fields: dict[str, Any] = {
        "at": at,
        "bundle": BUNDLE,
        "gate": None,
        "forced_mark": None,
        "sleep_level": None,
        "adapters": {},
    }
    return EngineReading(**{**fields, **changes})


def step(name: str, started: float, status: str = "done", **evidence: Any) -> dict[str, Any]:
    return {"step": name, "status": status, "started": started, "seconds": 0.5, "evidence": evidence}


STEPS = [
    step("precheck", 100.0),
    step("remove_from_routing", 100.5),
    step("drain_policy", 101.0, policy="wait"),
    step("execute", 101.5),
    step("verify", 102.0),
    step("postcheck", 102.5),
]


def op(kind: str = "sleep", outcome: str = SUCCEEDED, reason: str = "") -> Operation:
    return Operation(kind, f"{kind}-1", ENGINE, SUP, outcome, reason)


def record_of(kind: str = "sleep", steps: list[dict[str, Any]] | None = None, **kw: Any) -> ChangeRecord:
    before = kw.pop("before", reading())
    after = kw.pop("after", reading(at=103.0))
    record = assemble(
        op(kind, kw.pop("outcome", SUCCEEDED)), steps or STEPS, before, after, kw.pop("forced", None)
    )
    assert ChangeRecord.model_validate(record.to_file()) == record  # the file reads back as it was
    return record


def test_steps_are_timed_from_the_runbook_entries() -> None:
    failed = [
        *STEPS[:3],
        step("execute", 101.5, "failed", error="sleep call refused"),
        step("recover", 102.0),
    ]
    record = record_of(steps=failed, outcome=FAILED)
    assert [s.step for s in record.steps] == [
        "precheck",
        "remove_from_routing",
        "drain_policy",
        "execute",
        "recover",
    ]
    assert record.started == 100.0 and record.finished == 103.0
    assert [s.started for s in record.steps] == [100.0, 100.5, 101.0, 101.5, 102.0]
    assert record.steps[3].ok is False and record.steps[3].detail == "sleep call refused"
    assert record.steps[2].data == {"policy": "wait"} and record.outcome == FAILED


def test_memory_delta_per_pool_from_the_engine_figures() -> None:
    before = reading(memory=MemoryReading("engine_metrics", 6 * GIB, 0))
    after = reading(at=103.0, memory=MemoryReading("engine_metrics", 0, 2 * GIB))
    record = record_of(before=before, after=after)
    gpu, host = record.memory
    assert (gpu.pool, gpu.before_bytes, gpu.after_bytes, gpu.delta_bytes) == ("gpu", 6 * GIB, 0, -6 * GIB)
    assert (host.pool, host.before_bytes, host.after_bytes, host.delta_bytes) == ("host", 0, 2 * GIB, 2 * GIB)
    assert gpu.engine == ENGINE and gpu.source == "engine_metrics"
    assert not [n for n in record.not_measured if n.startswith("memory")]


def test_memory_not_read_is_none_and_named_never_zero() -> None:
    one_side = record_of(
        before=reading(memory=MemoryReading("nvml", 5 * GIB)),
        after=reading(at=103.0, memory_unread="no engine process was running"),
    )
    (gpu,) = one_side.memory  # NVML reports no host backup
    assert gpu.before_bytes == 5 * GIB and gpu.after_bytes is None and gpu.delta_bytes is None
    assert "memory after: no engine process was running" in one_side.not_measured
    neither = record_of(before=reading(memory_unread="NVML is not available here"))
    assert neither.memory == []
    assert "memory: NVML is not available here" in neither.not_measured


def test_forced_exits_none_without_a_gate_and_listed_with_one() -> None:
    ungated = record_of()
    assert ungated.forced_exits is None and ungated.request_failures is None
    assert any(n.startswith("forced_exits: no admission gate") for n in ungated.not_measured)
    assert any(n.startswith("request_failures: no admission gate") for n in ungated.not_measured)
    cut = {
        "request_id": "r-1",
        "path": "/v1/completions",
        "model": "m",
        "started": 101.0,
        "how": "engine_abort",
    }
    gated = record_of(
        before=reading(gate=RequestCounts(requests=10, errors=0, stream_failures=0), forced_mark=3),
        after=reading(at=103.0, gate=RequestCounts(requests=14, errors=2, stream_failures=1)),
        forced=[{**cut, "tokens_emitted": True, "ended": 101.2, "detail": ""}],
    )
    assert gated.forced_exits is not None and [
        (e.request_id, e.tokens_emitted) for e in gated.forced_exits
    ] == [("r-1", True)]
    failures = gated.request_failures
    assert failures is not None and failures.source == "gate"
    assert failures.during == RequestCounts(requests=4, errors=2, stream_failures=1)
    assert not [n for n in gated.not_measured if "gate" in n]
    none_cut = record_of(
        before=reading(gate=RequestCounts(), forced_mark=0), after=reading(gate=RequestCounts()), forced=[]
    )
    assert none_cut.forced_exits == []  # a gate saw none: an empty list, unlike None


def test_forced_exits_beyond_the_listed_cap_are_counted() -> None:
    many = [
        {
            "request_id": f"r-{i}",
            "path": "/v1/completions",
            "started": 1.0,
            "tokens_emitted": False,
            "how": "cut",
        }
        for i in range(FORCED_EXITS_LISTED + 3)
    ]
    record = record_of(forced=many, before=reading(gate=RequestCounts()), after=reading(gate=RequestCounts()))
    assert record.forced_exits is not None and len(record.forced_exits) == FORCED_EXITS_LISTED
    assert any(n.startswith("forced_exits: 3 more not listed") for n in record.not_measured)


def test_warmup_apart_from_the_observed_window() -> None:
    window = WindowSummary.of(TrafficFigures(requests=40, errors=0), 10.0, "engine_metrics")
    baseline = WindowSummary.of(TrafficFigures(requests=400, errors=0), 100.0, "engine_metrics")
    verdict = compare_windows(window, baseline, WindowThresholds())
    observed = [
        *STEPS[:4],
        step("verify", 102.0, warmup_ttft_ms=87.5),
        STEPS[5],
        step(
            "observe",
            103.0,
            window=window.to_wire(),
            baseline=baseline.to_wire(),
            verdict=verdict.to_wire(),
        ),
    ]
    record = record_of("wake", observed)
    assert record.latency.warmup_ttft_ms == {ENGINE: 87.5}
    assert record.latency.steady == window and record.latency.baseline == baseline
    assert record.latency.verdict == verdict
    assert not [n for n in record.not_measured if n.startswith("latency")]


def test_latency_not_observed_is_named() -> None:
    woken = record_of("wake")
    assert woken.latency.steady is None and woken.latency.warmup_ttft_ms == {}
    assert any(n.startswith("latency.warmup_ttft_ms") for n in woken.not_measured)
    assert any(n.startswith("latency.steady: no OBSERVE step") for n in woken.not_measured)
    asleep = record_of(
        "sleep", [*STEPS, step("observe", 103.0, verdict=None, not_applicable="the engine is SLEEPING")]
    )
    assert not any(n.startswith("latency.warmup") for n in asleep.not_measured)  # a sleep starts nothing
    assert "latency.steady: the engine is SLEEPING" in asleep.not_measured


def test_rollback_point_per_kind() -> None:
    asleep = reading(at=103.0, sleep_level=2)
    assert (
        record_of("sleep", after=asleep).rollback_point.command == f"corral wake --supervisor {SUP} --reload"
    )  # type: ignore[union-attr]
    woken = record_of("wake", before=reading(sleep_level=1))
    assert woken.rollback_point is not None
    assert woken.rollback_point.command == f"corral sleep --supervisor {SUP} --level 1"
    assert woken.rollback_point.bundles == {ENGINE: BUNDLE}
    loaded = record_of("lora_load", after=reading(at=103.0, adapters={"sql": "/a/sql"}))
    assert loaded.rollback_point.command == f"corral lora unload --supervisor {SUP} sql"  # type: ignore[union-attr]
    unloaded = record_of("lora_unload", before=reading(adapters={"sql": "/my adapters/sql"}))
    assert unloaded.rollback_point.command == f"corral lora load --supervisor {SUP} sql '/my adapters/sql'"  # type: ignore[union-attr]
    new = {"name": "next", "fingerprint": "def"}
    switched = record_of("switch_bundle", after=reading(at=103.0, bundle=new))
    assert switched.from_bundles == {ENGINE: BUNDLE} and switched.to_bundle == new
    assert switched.rollback_point.command == f"corral switch-bundle --supervisor {SUP} initial"  # type: ignore[union-attr]
    recovered = record_of("sleep", outcome=FAILED)  # RECOVER woke it: nothing to undo
    assert recovered.rollback_point is not None and recovered.rollback_point.command == ""


def test_a_refused_operation_records_that_nothing_changed() -> None:
    record = assemble(
        op("wake", REFUSED, "wake refused: the engine is READY"),
        [step("precheck", 100.0, "failed", error="wake refused: the engine is READY")],
        reading(),
        reading(),
        None,
    )
    assert record.outcome == REFUSED and record.reason == "wake refused: the engine is READY"
    assert record.rollback_point is None and record.memory == [] and record.forced_exits is None
    assert record.not_measured == ["every section: PRECHECK refused the operation before it changed anything"]


def test_the_gate_counts_refusals_and_forced_exits_as_failures() -> None:
    gate = AdmissionGate(ENGINE, lambda: EngineState.READY)
    gate.admitted["m"] += 7
    gate.refused[("m", NOT_READY)] += 2
    gate.refused[("", "path_not_served")] += 5  # the client's own error, not a failure
    gate.requests.forced[True] += 1
    gate.requests.forced[False] += 2
    assert gate.counts() == RequestCounts(requests=9, errors=5, stream_failures=3)


def test_the_rollback_command_reaches_a_wildcard_supervisor_on_loopback() -> None:
    assert management_url("0.0.0.0", 8081) == "http://127.0.0.1:8081"
    assert management_url("::1", 9) == "http://[::1]:9"
    assert management_url("10.0.0.2", 8081) == "http://10.0.0.2:8081"


def test_a_drain_record_times_its_steps_and_names_what_its_stop_cut() -> None:
    report = DrainReport(
        policy="wait",
        removal_epoch=4,
        quiet_reached=True,
        propagation_seconds=1.25,
        drain_seconds=2.0,
        stop_seconds=0.5,
        engine_killed=True,
        cut_short="1 running at SIGTERM; SIGKILLed",
        forced_exits=[
            {
                "request_id": "r-9",
                "path": "/v1/completions",
                "started": 1.0,
                "tokens_emitted": True,
                "how": "cut",
            }
        ],
    )
    drain = LedgerOperation("drain-1", "drain", started=1000.0)
    gated = drain_change_record(
        drain,
        report,
        ENGINE,
        BUNDLE,
        RequestCounts(requests=5),
        RequestCounts(requests=6, errors=1, stream_failures=1),
    )
    assert [(s.step, s.started, s.seconds, s.ok) for s in gated.steps] == [
        ("remove_from_routing", 1000.0, 1.25, True),
        ("drain_policy", 1001.25, 2.0, False),  # wait, and the requests did not finish
        ("stop_engine", 1003.25, 0.5, False),
    ]
    assert gated.steps[2].detail == "1 running at SIGTERM; SIGKILLed" and gated.to_bundle is None
    assert gated.forced_exits is not None and [e.request_id for e in gated.forced_exits] == ["r-9"]
    assert gated.request_failures is not None and gated.request_failures.during == RequestCounts(
        requests=1, errors=1, stream_failures=1
    )
    assert gated.memory == [] and any(n.startswith("memory:") for n in gated.not_measured)
    unobserved = DrainReport(
        policy="wait",
        notes=["drain in SLEEPING: nothing was routed here"],
        forced_exits_unobserved="no admission gate",
    )
    ungated = drain_change_record(
        LedgerOperation("sd-1", "shutdown", started=5.0), unobserved, ENGINE, BUNDLE, None, None
    )
    assert ungated.kind == "shutdown" and ungated.forced_exits is None and ungated.request_failures is None
    assert "forced_exits: no admission gate" in ungated.not_measured
    assert ungated.steps[0].detail == "drain in SLEEPING: nothing was routed here" and ungated.steps[1].ok
