"""Whose a change record is (`check_owner`), a fleet file's `fleet_id` as input, and the runs archive
with records whose `fleet_id` is hostile (a path that would climb out of the archive, not a string)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.fleet.local.record_archive import archive_fleet_records, archive_port_records
from corral.fleet_identity import FleetIdentity, FleetIdError, ForeignRecord, check_owner

THIS = FleetIdentity("fleet-aaaaaaaaaaaa", "run-1", "/state/up-8000.json")


def test_this_fleets_record_passes_and_anothers_names_whose_it_is() -> None:
    check_owner({"fleet_id": THIS.id, "fleet_run": THIS.run}, "r.json", THIS, "do X")
    check_owner({"fleet_id": THIS.id}, "r.json", THIS, "do X")  # a record that names no run
    with pytest.raises(ForeignRecord) as info:
        check_owner(
            {"fleet_id": "fleet-bbbbbbbbbbbb", "fleet_run": "run-0", "router": "http://h:1", "finished": 0},
            "r.json",
            THIS,
            "do X",
        )
    said = str(info.value)
    assert said.startswith("change record r.json belongs to fleet fleet-bbbbbbbbbbbb (run run-0)")
    assert "router http://h:1, finished 1970-01-01 00:00:00 UTC" in said
    assert "not to this fleet (fleet-aaaaaaaaaaaa, run run-1, from /state/up-8000.json)" in said
    assert said.endswith("; do X")
    with pytest.raises(ForeignRecord, match="belongs to fleet fleet-aaaaaaaaaaaa \\(run run-0\\)"):
        check_owner({"fleet_id": THIS.id, "fleet_run": "run-0"}, "r.json", THIS, "do X")


def test_a_record_from_before_fleet_ids_is_refused_by_a_fleet_that_has_one() -> None:
    with pytest.raises(ForeignRecord, match=r"change record r\.json names no fleet"):
        check_owner({"kind": "rollout"}, "r.json", THIS, "do X")
    nameless = FleetIdentity(None, None, "fleet.yaml")
    check_owner({"kind": "rollout"}, "r.json", nameless, "do X")  # neither names one: as before
    check_owner({"fleet_id": None}, "r.json", nameless, "do X")
    with pytest.raises(ForeignRecord, match=r"belongs to fleet fleet-aaaaaaaaaaaa.*gives it no fleet_id"):
        check_owner({"fleet_id": THIS.id}, "r.json", nameless, "do X")


@given(st.one_of(st.integers(), st.floats(), st.lists(st.text()), st.text(max_size=200), st.none()))
def test_any_recorded_fleet_id_is_judged_without_an_error_of_its_own(owner: Any) -> None:
    record = {"fleet_id": owner, "fleet_run": owner, "finished": owner, "router": owner}
    try:
        check_owner(record, "r.json", THIS, "do X")
    except ForeignRecord as exc:
        assert len(str(exc)) < 1000 and str(exc).endswith("do X")


@pytest.mark.parametrize("value", ["../../etc", "", "a b", "x" * 65, 7, ["fleet-1"], "-flag"])
def test_a_fleet_file_with_a_bad_fleet_id_names_the_file(value: Any) -> None:
    with pytest.raises(FleetIdError, match=r"fleet file f.yaml: fleet_id .* is not a fleet name"):
        FleetIdentity.of_fleet_file({"fleet_id": value}, "f.yaml")
    assert FleetIdentity.of_fleet_file({"fleet_id": "prod-east.1"}, "f.yaml").id == "prod-east.1"
    assert FleetIdentity.of_fleet_file({}, "f.yaml") == FleetIdentity(None, None, "f.yaml")


def test_new_identities_differ() -> None:
    assert FleetIdentity.new("a").id != FleetIdentity.new("a").id


def test_the_archive_keeps_every_record_inside_it_whatever_its_fleet_id(tmp_path: Path) -> None:
    state = tmp_path / "corral"
    state.mkdir()
    bodies = {
        "verify-8000.json": orjson.dumps({"kind": "verify", "fleet_id": "../../escape"}),
        "rollout-8000.json": orjson.dumps({"kind": "rollout", "fleet_id": "fleet-aaaaaaaaaaaa"}),
        "rollback-8000.json": b'{"kind": "rollback", "started": 1',  # half a file
        "rollout-8001.json": orjson.dumps({"kind": "rollout"}),  # another port's: left alone
    }
    for name, body in bodies.items():
        (state / name).write_bytes(body)
    moved = archive_port_records(state, 8000)
    runs = state / "runs"
    assert sorted(p.relative_to(runs).as_posix() for p in moved) == [
        "fleet-aaaaaaaaaaaa/rollout-8000.json",
        "unowned/rollback-8000.json",
        "unowned/verify-8000.json",
    ]
    assert {p.name for p in state.iterdir()} == {"runs", "rollout-8001.json"}
    assert not (tmp_path / "escape").exists()
    for path in moved:
        assert path.read_bytes() == bodies[path.name]

    # the same names again: kept beside the first ones, nothing overwritten
    (state / "verify-8000.json").write_bytes(b"{}")
    again = archive_port_records(state, 8000)
    assert len(again) == 1 and again[0].parent == runs / "unowned" and again[0].name != "verify-8000.json"
    assert (runs / "unowned" / "verify-8000.json").read_bytes() == bodies["verify-8000.json"]


def test_the_supervisors_records_of_this_fleet_go_and_anothers_stay(tmp_path: Path) -> None:
    mine, other = "fleet-aaaaaaaaaaaa", "fleet-bbbbbbbbbbbb"
    (tmp_path / "sleep-4001.json").write_bytes(orjson.dumps({"kind": "sleep", "fleet_id": mine}))
    (tmp_path / "wake-4002.json").write_bytes(orjson.dumps({"kind": "wake", "fleet_id": other}))
    (tmp_path / "up-4001.json").write_bytes(orjson.dumps({"fleet_id": mine}))  # a fleet file: never
    # not one of its supervisors' ports
    (tmp_path / "wake-4003.json").write_bytes(orjson.dumps({"kind": "wake", "fleet_id": mine}))
    moved = archive_fleet_records(tmp_path, {4001, 4002}, mine)
    assert moved == [tmp_path / "runs" / mine / "sleep-4001.json"]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"runs", "wake-4002.json", "up-4001.json", "wake-4003.json"}
