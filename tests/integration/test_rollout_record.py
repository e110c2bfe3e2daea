"""A real rollout's and rollback's change records: `check_complete_record` is what
tests/integration/test_rollout.py asserts of both records of its rollout and rollback under load
(typed `RolloutRecord`, Corral version, the router's request counters before and after against the
load generator's, each old engine's memory beside its successor's, no forced exit, a rollback point
`corral rollback` reads back), so the records cost no fleet of their own; and a corrupt record is
refused by `corral rollback`, naming its path."""

from __future__ import annotations

from pathlib import Path

import orjson

from corral import __version__
from corral.contracts.records import RolloutRecord
from tests.support.procs import CorralProcess

# the router counts what the load sent while the rollout ran, plus the requests in flight when it
# read its counters first (at most one per load worker) and POSTCHECK's own smoke requests
IN_FLIGHT_AT_START = 8
SMOKES = 10


def check_complete_record(path: Path, sent: int, old_engines: set[str], port: str) -> RolloutRecord:
    """The record at `path` of a clean rollout (no request failed) that replaced `old_engines` (by
    name) while a load generator sent `sent` requests through the router."""
    record = RolloutRecord.model_validate(orjson.loads(path.read_bytes()))
    assert record.schema_version == 2 and record.corral_version == __version__
    assert record.outcome == "succeeded" and record.started < record.finished
    # every step timed, in the order they started
    assert record.steps[0].step == "PRECHECK" and record.steps[-1].step == "POSTCHECK"
    assert all(s.started >= record.started and s.seconds >= 0 and s.ok for s in record.steps)
    assert [s.started for s in record.steps] == sorted(s.started for s in record.steps)

    failures = record.request_failures
    assert failures is not None and failures.source == record.router
    assert failures.during == failures.after.minus(failures.before)
    print(f"{record.kind}: the router counted {failures.during} during it; the load sent {sent}")
    assert failures.during.errors == 0 and failures.during.stream_failures == 0
    assert 0 < failures.during.requests <= sent + IN_FLIGHT_AT_START + SMOKES

    # each old engine's last figure beside the first of the new engine in its place
    by_engine = {m.engine: m for m in record.memory}
    assert set(by_engine) == old_engines, record.memory
    for delta in by_engine.values():
        assert delta.replaced_by and delta.replaced_by not in old_engines
        assert delta.source == "engine_metrics" and delta.before_bytes and delta.after_bytes
        assert delta.delta_bytes == delta.after_bytes - delta.before_bytes

    assert record.forced_exits == []  # confirmed drains behind the gates cut nothing
    point = record.rollback_point
    assert point is not None and point.bundles == record.from_bundles
    assert point.command == f"corral rollback --from-record {path} --port {port}"
    assert not [n for n in record.not_measured if n.startswith(("request failures", "memory", "forced"))]
    return record


def test_rollback_from_a_corrupt_record_names_the_file(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("router: http://127.0.0.1:9\nsupervisors: [http://127.0.0.1:9]\n")
    corrupt = tmp_path / "rollout-9.json"
    corrupt.write_text('{"kind": "rollout", "started": 1')
    proc = CorralProcess(["rollback", "--fleet", str(fleet), "--from-record", str(corrupt)])
    assert proc.wait_exit(60) == 2
    # the refusal is the contract: one line naming the value and what to do
    assert f"{corrupt} is not JSON" in proc.output(), proc.output()
    verify = tmp_path / "verify-9.json"
    verify.write_text('{"kind": "verify", "started": 1, "finished": 2}')
    proc = CorralProcess(["rollback", "--fleet", str(fleet), "--from-record", str(verify)])
    assert proc.wait_exit(60) == 2
    assert f"{verify} is a verify record, not a rollout's" in proc.output(), proc.output()
