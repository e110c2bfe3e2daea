"""The runs archive: when a local fleet stops (Ctrl-C, a member that died, a failed start), `corral up`
moves the change records of its port (`verify-PORT.json`, `rollout-PORT.json`, `rollback-PORT.json`)
into `runs/<fleet id>/` under the state dir, so the next fleet on that port starts with none of them.
A new `corral up` does the same first with any record an earlier fleet left (one killed with SIGKILL
had no chance to).

Each record goes by one rename (`os.replace`, same file system): it is at its old path or its new one,
never half of it in either. A record's folder is its own `fleet_id` when that is a fleet name
(`corral.fleet_identity.FLEET_ID`), else `unowned` (a record from before records named their
fleet, or one whose fleet_id could climb out of the archive); a name already taken there gets the
record's modification time and a number.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.fleet.checks.change_record import read_record
from corral.fleet_identity import FLEET_ID

RECORD_KINDS = ("verify", "rollout", "rollback")
UNOWNED = "unowned"


def runs_dir(state_dir: Path) -> Path:
    return state_dir / "runs"


def port_records(state_dir: Path, port: int) -> list[Path]:
    """The change records of `port` in the state dir now."""
    return [p for kind in RECORD_KINDS if (p := state_dir / f"{kind}-{port}.json").is_file()]


def archive_folder(state_dir: Path, record: Path) -> Path:
    """Where `record` goes: runs/<its fleet_id>, or runs/unowned."""
    body = read_record(record) or {}
    owner = body.get("fleet_id")
    name = owner if isinstance(owner, str) and FLEET_ID.match(owner) else UNOWNED
    return runs_dir(state_dir) / name


def _free_name(folder: Path, record: Path) -> Path:
    target = folder / record.name
    if not target.exists():
        return target
    stamp = int(record.stat().st_mtime)
    for n in range(1, 1000):
        target = folder / f"{record.stem}.{stamp}.{n}{record.suffix}"
        if not target.exists():
            return target
    raise OSError(f"{folder} has a thousand copies of {record.name} already")


def archive_port_records(state_dir: Path, port: int) -> list[Path]:
    """Move the port's change records into the runs archive; returns where they went. Raises OSError
    (the records not yet moved stay where they were)."""
    return [archive_record(state_dir, record) for record in port_records(state_dir, port)]


def archive_record(state_dir: Path, record: Path) -> Path:
    """Move one record into runs/<its fleet_id or unowned>/; returns where it went. Raises OSError."""
    folder = archive_folder(state_dir, record)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = _free_name(folder, record)
    os.replace(record, target)
    return target


def archive_fleet_records(state_dir: Path, ports: set[int], fleet_id: str) -> list[Path]:
    """Move the records of `fleet_id` kept under its supervisors' ports (`KIND-PORT.json`, any kind
    but the fleet files `up-PORT.*`) into runs/<fleet_id>/; another fleet's stay. Raises OSError."""
    moved: list[Path] = []
    folder = runs_dir(state_dir) / fleet_id
    for port in sorted(ports):
        for record in sorted(state_dir.glob(f"*-{port}.json")):
            if record.name.startswith("up-") or (read_record(record) or {}).get("fleet_id") != fleet_id:
                continue
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            target = _free_name(folder, record)
            os.replace(record, target)
            moved.append(target)
    return moved
