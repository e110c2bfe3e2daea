"""A rollout's change record assembled from its steps and readings (fleet/rollout/record.py): forced
exits unioned over the drains (None when one drain could not observe them), the router's request
failures as a difference, memory per engine paired with its successor, and the record file read back
typed (schema 1 files too; a corrupt file named)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from corral.bundle_spec import BundleSpec
from corral.clients.calls import APIError
from corral.contracts.records import RolloutRecord
from corral.contracts.router import RouterFleet
from corral.contracts.supervisor import SupervisorState
from corral.contracts.traffic import RequestCounts, WindowSummary, WindowVerdict
from corral.contracts.up import GroupMember
from corral.fleet.checks.change_record import RecordError, read_change_record, write_record
from corral.fleet.engine_memory import EngineMemory, memory_of
from corral.fleet.rollout.record import (
    Reading,
    RecordReadings,
    forced_exits,
    memory_deltas,
    request_failures,
    rollout_record,
)
from corral.fleet.rollout.steps import Group, RolloutSettings, Step

GIB = 1 << 30


def exit_(request_id: str, tokens: bool) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "path": "/v1/chat/completions",
        "started": 1.0,
        "tokens_emitted": tokens,
        "how": "cut",
    }


def drain(group: str, **reports: dict[str, Any]) -> Step:
    step = Step("DRAIN", group, ok=True)
    step.data = {"reports": reports}
    return step


def observed(*exits: dict[str, Any], not_listed: int = 0) -> dict[str, Any]:
    return {"routers_missing": [], "forced_exits": list(exits), "forced_exits_not_listed": not_listed}


UNOBSERVED = {"forced_exits": None, "forced_exits_unobserved": "no admission gate: the engine is not gated"}


def test_forced_exits_are_the_union_of_every_drained_members_report() -> None:
    steps = [
        Step("PRECHECK", None, ok=True),
        drain("g0", e0=observed(exit_("a", True)), e1=observed()),
        drain("g1", e2=observed(exit_("b", False), exit_("c", True))),
    ]
    exits, notes = forced_exits(steps)
    assert exits is not None and notes == []
    assert [(e.request_id, e.tokens_emitted) for e in exits] == [("a", True), ("b", False), ("c", True)]


def test_one_member_that_could_not_observe_them_makes_the_list_unknown_not_empty() -> None:
    exits, notes = forced_exits([drain("g0", e0=observed(exit_("a", True))), drain("g1", e2=UNOBSERVED)])
    assert exits is None
    assert notes == ["forced exits: DRAIN g1 e2: no admission gate: the engine is not gated"]


def test_a_drain_whose_report_never_came_back_is_unobserved_and_a_capped_list_is_kept() -> None:
    failed = Step("DRAIN", "g1", detail="http://sup2: drain failed: timed out")
    exits, notes = forced_exits([drain("g0", e0=observed()), failed])
    assert exits is None and "DRAIN g1: no drain report came back (http://sup2: drain failed" in notes[0]
    capped, notes = forced_exits([drain("g0", e0=observed(exit_("a", True), not_listed=3))])
    assert capped is not None and len(capped) == 1
    assert notes == ["forced exits: DRAIN g0 e0: 3 more not listed"]


def test_a_host_switch_brings_its_own_records_forced_exits() -> None:
    switched = Step("SWITCH", "host-0", ok=True)
    switched.data = {"change_record": {"forced_exits": [exit_("s", True)], "not_measured": []}}
    exits, notes = forced_exits([switched])
    assert exits is not None and [e.request_id for e in exits] == ["s"] and notes == []
    back = Step("RECOVER", "host-0", ok=True)  # switched back: a drain of its own
    back.data = {"change_record": {"forced_exits": [exit_("r", False)], "not_measured": []}}
    exits, _ = forced_exits([switched, back])
    assert exits is not None and [e.request_id for e in exits] == ["s", "r"]
    ungated = Step("SWITCH", "host-1", ok=True)
    ungated.data = {
        "change_record": {"forced_exits": None, "not_measured": ["forced_exits: no admission gate"]}
    }
    exits, notes = forced_exits([switched, ungated])
    assert exits is None and notes == ["forced exits: SWITCH host-1: no admission gate"]


def test_nothing_drained_means_no_forced_exit() -> None:
    assert forced_exits([Step("PRECHECK", None, ok=False)]) == ([], [])


def readings(start: Reading | None, end: Reading | None) -> RecordReadings:
    found = RecordReadings(None)  # type: ignore[arg-type]  # never asked: the readings are given
    found.start, found.end = start, end
    return found


def test_request_failures_are_the_router_counters_difference() -> None:
    before = RequestCounts(requests=1000, errors=4, stream_failures=1)
    after = RequestCounts(requests=1750, errors=4, stream_failures=1)
    failures, missing = request_failures("http://r", readings(Reading(totals=before), Reading(totals=after)))
    assert missing == "" and failures is not None
    assert failures.during == RequestCounts(requests=750, errors=0, stream_failures=0)
    assert (failures.before, failures.after, failures.source) == (before, after, "http://r")


def test_a_router_without_totals_or_a_rollout_stopped_early_is_named_not_zero() -> None:
    old = Reading(totals=None, totals_missing="the router's /v1/fleet has no request totals")
    failures, missing = request_failures("http://r", readings(old, Reading(totals=RequestCounts())))
    assert failures is None and "has no request totals" in missing
    failures, missing = request_failures("http://r", readings(None, None))
    assert failures is None and "before PRECHECK" in missing


def state(memory: dict[str, Any] | None) -> SupervisorState:
    return SupervisorState.model_validate(
        {"state": "READY", "epoch": 1, **({"memory": memory} if memory else {})}
    )


class Router:
    """The one call the readings make of the router: its /v1/fleet, with or without totals."""

    def __init__(self, *totals: RequestCounts | None) -> None:
        self.totals = list(totals)

    async def fleet(self) -> RouterFleet:
        return RouterFleet(totals=self.totals.pop(0))


SIM_MEMORY = {
    "last": {"source": "engine_metrics", "figures": {"gpu_weights_bytes": GIB, "gpu_kv_cache_bytes": GIB}}
}


def group(name: str, *members: str) -> Group:
    return Group(
        name, None, [GroupMember(name=m, group=name, supervisor=f"http://{m}", engine="") for m in members]
    )


async def test_the_end_reading_keeps_what_it_could_read_and_names_the_rest() -> None:
    found = RecordReadings(Router(RequestCounts(requests=5), RequestCounts(requests=9)))  # type: ignore[arg-type]
    await found.at_start([group("g0", "e0", "e1")], [[state(SIM_MEMORY), state(None)]])

    async def groups() -> list[Group]:
        return [group("g0'", "e2", "e3")]

    async def state_of(url: str) -> SupervisorState:
        if url == "http://e3":
            raise APIError("http://e3/v1/state", None, "connection refused")
        return state(SIM_MEMORY)

    await found.at_end(groups, state_of)
    assert found.end is not None and found.end.totals == RequestCounts(requests=9)
    assert found.end.memory == {"e2": EngineMemory("engine_metrics", 2 * GIB)}
    assert "its supervisor did not answer" in found.end.memory_missing["e3"]
    deltas, missing = memory_deltas(found, [{"old": "g0", "new": "g0'"}])
    assert [(d.engine, d.replaced_by, d.delta_bytes) for d in deltas] == [("e0", "e2", 0)]
    assert missing == [
        "memory of e1: before: the supervisor reports no memory",
        "memory of e3: after: its supervisor did not answer: http://e3/v1/state: connection refused",
    ]

    async def unreadable() -> list[Group]:
        raise APIError("http://control/v1/groups", None, "connection refused")

    lost = RecordReadings(Router(None, None))  # type: ignore[arg-type]
    await lost.at_start([group("g0", "e0")], [[state(SIM_MEMORY)]])
    await lost.at_end(unreadable, state_of)
    assert "could not be read at the end" in lost.end_missing
    failures, why = request_failures("http://r", lost)
    assert failures is None and "no request totals" in why


def test_memory_is_read_from_the_supervisors_last_verdict() -> None:
    sim = {
        "last": {
            "operation": "ready",
            "source": "engine_metrics",
            "figures": {"gpu_weights_bytes": 2 * GIB, "gpu_kv_cache_bytes": GIB},
        }
    }
    assert memory_of(state(sim)) == (EngineMemory("engine_metrics", 3 * GIB), "")
    nvml = {"last": {"operation": "sleep", "source": "nvml", "after": {"total_bytes": GIB // 2}}}
    assert memory_of(state(nvml)) == (EngineMemory("nvml", GIB // 2), "")
    unmeasured = {
        "last": {
            "operation": "ready",
            "outcome": "not_measured",
            "source": None,
            "reason": "not measured: no NVML",
        }
    }
    assert memory_of(state(unmeasured)) == (None, "not measured: no NVML")
    assert memory_of(state(None)) == (None, "the supervisor reports no memory")


def test_each_old_engine_is_paired_with_the_new_engine_in_its_place() -> None:
    start = Reading(
        groups={"g0": ["e0", "e1"], "g1": ["e2"]},
        memory={
            "e0": EngineMemory("engine_metrics", 3 * GIB),
            "e1": EngineMemory("engine_metrics", 3 * GIB),
            "e2": EngineMemory("engine_metrics", 3 * GIB),
        },
    )
    end = Reading(
        groups={"g0'": ["e3", "e4"], "g1": ["e2"], "g2": ["e5"]},
        memory={
            "e3": EngineMemory("engine_metrics", 4 * GIB),
            "e2": EngineMemory("engine_metrics", 3 * GIB),
            "e5": EngineMemory("nvml", GIB),
        },
        memory_missing={"e4": "no memory verdict yet"},
    )
    deltas, missing = memory_deltas(readings(start, end), [{"old": "g0", "new": "g0'"}])
    by_engine = {d.engine: d for d in deltas}
    assert (by_engine["e0"].replaced_by, by_engine["e0"].delta_bytes) == ("e3", GIB)
    assert (by_engine["e1"].after_bytes, by_engine["e1"].delta_bytes) == (None, None)
    assert (by_engine["e2"].replaced_by, by_engine["e2"].delta_bytes) == (None, 0)  # untouched: itself
    assert (by_engine["e5"].before_bytes, by_engine["e5"].after_bytes) == (None, GIB)  # took no one's place
    assert missing == ["memory of e4: after: no memory verdict yet"]


@dataclass
class Facts:
    """What `rollout_record` reads of a rollout, as a finished one would hold it."""

    readings: RecordReadings
    steps: list[Step]
    kind: str = "rollout"
    id: str = "rollout-0123456789"
    router: str = "http://127.0.0.1:8000"
    target: BundleSpec = field(default_factory=lambda: BundleSpec(name="v2"))
    settings: RolloutSettings = field(default_factory=RolloutSettings)
    from_bundles: dict[str, dict[str, Any]] = field(default_factory=lambda: {"g0": {"name": "v1"}})
    replaced: list[dict[str, str]] = field(
        default_factory=lambda: [{"old": "g0", "new": "g0'", "fingerprint": "f2"}]
    )
    fingerprints: dict[str, str] = field(default_factory=lambda: {"g0": "f1", "g0'": "f2"})
    adapters: dict[str, str] = field(default_factory=lambda: {"sql": "/a/sql"})
    canary: list[WindowVerdict] = field(default_factory=list)
    warmup_ttft_ms: dict[str, float] = field(default_factory=lambda: {"e3": 41.5})
    rollback_command: str = "corral rollback --from-record /s/rollout-8000.json --port 8000"
    undoes: str | None = None


def test_the_whole_record_validates_and_reads_back_typed(tmp_path: Path) -> None:
    window = WindowSummary(
        source="router", seconds=5, requests=80, errors=0, error_ratio=0.0, ttft_p99_ms=30.0
    )
    verdict = WindowVerdict(verdict="passed", reason="ok", window=window, baseline=window)
    start = Reading(
        groups={"g0": ["e0"]},
        totals=RequestCounts(requests=10),
        memory={"e0": EngineMemory("engine_metrics", GIB)},
    )
    end = Reading(
        groups={"g0'": ["e3"]},
        totals=RequestCounts(requests=90),
        memory={"e3": EngineMemory("engine_metrics", GIB)},
    )
    facts = Facts(
        readings(start, end), [Step("PRECHECK", None, ok=True), drain("g0", e0=observed())], canary=[verdict]
    )
    record = rollout_record(facts, "succeeded", "verify: 9 checks, none failed", 1.0)

    assert record.corral_version and record.schema_version == 2
    assert record.request_failures is not None and record.request_failures.during.requests == 80
    assert record.forced_exits == [] and record.latency.warmup_ttft_ms == {"e3": 41.5}
    assert record.latency.verdict == verdict and record.latency.steady == window
    assert record.rollback_point is not None and record.rollback_point.bundles == {"g0": {"name": "v1"}}
    assert record.rollback_point.command.startswith("corral rollback --from-record")
    assert record.memory[0].replaced_by == "e3" and record.memory[0].delta_bytes == 0
    assert record.adapters == {"carried": {"sql": "/a/sql"}, "served": ["sql"]}
    assert record.not_measured == []

    path = tmp_path / "rollout-8000.json"
    write_record(path, record)
    back = read_change_record(path)
    assert isinstance(back, RolloutRecord) and back == record


def test_what_nothing_measured_is_named_in_not_measured() -> None:
    facts = Facts(readings(None, None), [Step("PRECHECK", None)], from_bundles={}, warmup_ttft_ms={})
    record = rollout_record(facts, "failed", "PRECHECK: router down", 1.0)
    assert record.request_failures is None and record.rollback_point is None and record.memory == []
    lines = " | ".join(record.not_measured)
    for section in ("request failures", "memory", "warmup TTFT", "steady-state", "rollback point"):
        assert section in lines


def test_a_record_from_before_issue_15_reads_as_schema_1(tmp_path: Path) -> None:
    path = tmp_path / "rollout-8000.json"
    path.write_text(
        '{"kind": "rollout", "id": "rollout-1", "outcome": "succeeded", "reason": "", "started": 1.0,'
        ' "finished": 2.0, "router": "http://r", "to_bundle": {"name": "v2"}, "from_bundles": {"g0": {"name":'
        ' "v1"}}, "settings": {"max_surge": 1, "max_unavailable": 0}, "replaced": [], "fingerprints": {},'
        ' "adapters": {"carried": {}, "served": []}, "steps": [{"step": "PRECHECK", "group": null,'
        ' "started": 1.0, "seconds": 0.1, "ok": true, "detail": ""}]}'
    )
    record = read_change_record(path)
    assert isinstance(record, RolloutRecord)
    assert record.schema_version == 1 and record.from_bundles == {"g0": {"name": "v1"}}
    assert record.request_failures is None and record.corral_version is None


def test_a_corrupt_or_foreign_file_is_named(tmp_path: Path) -> None:
    assert read_change_record(tmp_path / "absent.json") is None
    corrupt = tmp_path / "rollout-8000.json"
    corrupt.write_text('{"kind": "rollout", "started": 1')
    with pytest.raises(RecordError, match=f"{corrupt} is not JSON"):
        read_change_record(corrupt)
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"name": "a bundle"}')
    with pytest.raises(RecordError, match=f"{foreign} is not a change record"):
        read_change_record(foreign)
    broken = tmp_path / "broken.json"
    broken.write_text('{"kind": "rollout", "started": "yesterday", "finished": 2}')
    with pytest.raises(RecordError, match=f"{broken} is not a rollout change record"):
        read_change_record(broken)
