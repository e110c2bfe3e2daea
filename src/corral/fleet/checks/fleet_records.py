"""The change records of a local fleet's port that are that fleet's own, for `corral status`: the newest
of them (its last change) and, for every record there that is another fleet's (or names none), the line
saying so. Status only shows: a record that is not the fleet's is left out and named, never refused
(`corral verify` and `corral rollback` refuse one: corral.fleet_identity.check_owner)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.fleet.checks.change_record import read_record
from corral.fleet_identity import FleetIdentity, ForeignRecord, check_owner

KINDS = ("verify", "rollout", "rollback")


@dataclass(frozen=True)
class LastChange:
    kind: str
    id: str | None
    outcome: str | None
    finished: float
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "outcome": self.outcome,
            "finished": self.finished,
            "record": str(self.path),
        }


@dataclass(frozen=True)
class FleetRecords:
    last: LastChange | None
    ignored: list[str]  # why each record at the port that is not this fleet's was left out


def fleet_records(state_dir: Path, port: int, fleet: FleetIdentity) -> FleetRecords:
    last: LastChange | None = None
    ignored: list[str] = []
    to_do = f"`corral up` keeps a stopped fleet's records in {state_dir / 'runs'}/FLEET_ID/: move it there"
    for kind in KINDS:
        path = state_dir / f"{kind}-{port}.json"
        body = read_record(path)
        if body is None:
            continue
        try:
            check_owner(body, str(path), fleet, to_do)
        except ForeignRecord as exc:
            ignored.append(str(exc))
            continue
        finished = body.get("finished")
        if not isinstance(finished, int | float) or isinstance(finished, bool):
            continue
        if last is None or finished > last.finished:
            record_id, outcome = body.get("id"), body.get("outcome")
            last = LastChange(
                str(body.get("kind") or kind),
                str(record_id) if record_id is not None else None,
                str(outcome) if outcome is not None else None,
                float(finished),
                path,
            )
    return FleetRecords(last, ignored)
