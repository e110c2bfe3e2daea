"""Which fleet a change record belongs to. `corral up` makes a fleet id (`fleet-<12 hex>`) and a run id
for every fleet it starts and writes both into its fleet file; every change record written against a
fleet (`verify`, `rollout`, `rollback`) carries them (`fleet_id`, `fleet_run`). A fleet file written by
hand (hosts with their supervisors) may name a `fleet_id` of its own; a fleet named by flags names none.

Before a command judges a fleet against a record, or undoes one, `check_owner` refuses a record of
another fleet (an earlier fleet on the same port, say) and a record from before records named their
fleet, each with which record, whose it is and what to do. A fleet id is also a folder name in the
runs archive (corral.fleet.local.record_archive), so only `FLEET_ID` names are accepted as one.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FLEET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ForeignRecord(ValueError):
    """A change record that is not this fleet's; the message says whose it is and what to do."""


class FleetIdError(ValueError):
    """A fleet file whose `fleet_id` or `fleet_run` cannot be one; the message names the file."""


@dataclass(frozen=True)
class FleetIdentity:
    """A fleet's id and the run of it (None: the fleet names none), and where they were read."""

    id: str | None
    run: str | None
    source: str  # the fleet file they came from, or how the fleet was named

    @classmethod
    def new(cls, source: str) -> FleetIdentity:
        """A fresh identity for a fleet `corral up` starts now."""
        run = f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
        return cls(f"fleet-{secrets.token_hex(6)}", run, source)

    @classmethod
    def of_fleet_file(cls, body: Mapping[str, Any], where: str) -> FleetIdentity:
        """The identity a fleet file names (`fleet_id`, `fleet_run`); both optional. Raises FleetIdError
        for a value that is not a short name of letters, digits, `.`, `_` and `-`."""
        found: dict[str, str | None] = {}
        for key in ("fleet_id", "fleet_run"):
            value = body.get(key)
            if value is not None and not (isinstance(value, str) and FLEET_ID.match(value)):
                raise FleetIdError(
                    f"fleet file {where}: {key} {str(value)[:80]!r} is not a fleet name (1-64 letters, "
                    "digits, '.', '_' or '-', starting with a letter or digit); fix it or leave it out"
                )
            found[key] = value
        return cls(found["fleet_id"], found["fleet_run"], where)

    def stamp(self) -> dict[str, str | None]:
        """The fields every change record of this fleet carries."""
        return {"fleet_id": self.id, "fleet_run": self.run}

    def describe(self) -> str:
        if self.id is None:
            return f"this fleet (named by {self.source}, which gives it no fleet_id)"
        run = f", run {self.run}" if self.run else ""
        return f"this fleet ({self.id}{run}, from {self.source})"


def _finished(record: Mapping[str, Any]) -> str:
    value = record.get("finished")
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return f", finished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(value))}"
        except (OverflowError, OSError, ValueError):  # no date at all: a hand-edited record
            return f", finished {str(value)[:40]}"
    return ""


def check_owner(record: Mapping[str, Any], where: str, fleet: FleetIdentity, to_do: str) -> None:
    """Raises ForeignRecord when `record` (read from `where`) is not `fleet`'s: it names another fleet
    or run, or it names none (written before records named their fleet) while the fleet has an id.
    `to_do` ends the message: what the person can do instead."""
    if "fleet_id" not in record:
        if fleet.id is None:
            return  # neither names a fleet: as before records named theirs
        raise ForeignRecord(
            f"change record {where} names no fleet (it was written before change records named their "
            f"fleet, maybe by an earlier fleet on this port{_finished(record)}), so it cannot be shown to "
            f"belong to {fleet.describe()}; {to_do}"
        )
    owner, run = record.get("fleet_id"), record.get("fleet_run")
    same_run = run is None or fleet.run is None or run == fleet.run
    if owner == fleet.id and same_run:
        return
    router = f", router {record['router']}" if isinstance(record.get("router"), str) else ""
    whose = (
        f"fleet {str(owner)[:80]}" + (f" (run {str(run)[:80]})" if run else "")
        if owner is not None
        else "a fleet that names no fleet_id"
    )
    raise ForeignRecord(
        f"change record {where} belongs to {whose}{router}{_finished(record)}, not to "
        f"{fleet.describe()}: it is another fleet's record; {to_do}"
    )
