"""Change records on disk: one JSON file per fleet operation (`verify`, `rollout`, `rollback`) in the
one schema of contracts/records.py, written atomically (temp file, then rename), read back loosely
(`read_record`: a dict or None) or typed (`read_change_record`, which names a file it cannot read)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from corral import __version__
from corral.atomic_file import write_atomically
from corral.contracts.records import ChangeRecord, EngineRecord, RolloutRecord, VerifyRecord
from corral.contracts.wire import first_message
from corral.engine_state import EngineState
from corral.fleet.checks.probe import EngineView, FleetView
from corral.state_home import corral_state_dir


def default_record_path(kind: str, port: int) -> Path:
    return corral_state_dir() / f"{kind}-{port}.json"


class RecordError(ValueError):
    """A change record file that cannot be read as one; the message names the file and what to do."""


def read_record(path: Path) -> dict[str, Any] | None:
    """The file's JSON object as it is (any schema), or None when it is missing, corrupt or foreign:
    for readers that only look for a field or two and carry on without."""
    try:
        body = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return body if isinstance(body, dict) else None


_MODELS: dict[str, type[ChangeRecord]] = {
    "verify": VerifyRecord,
    "rollout": RolloutRecord,
    "rollback": RolloutRecord,
}


def read_change_record(path: Path) -> ChangeRecord | None:
    """The record in `path` as its kind's model (`RolloutRecord` for a rollout or rollback,
    `VerifyRecord`, else `ChangeRecord`); None when there is no such file. A record written before
    issue 15 (no `schema`) reads as schema 1, its sections absent. RecordError for a file that is
    unreadable, not JSON or not a change record."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RecordError(f"change record {path} is unreadable: {exc.strerror or exc}") from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"change record {path} is not JSON ({exc}); a truncated or foreign file?") from None
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise RecordError(f"{path} is not a change record (no `kind`); pass the path of one")
    model = _MODELS.get(body["kind"], ChangeRecord)
    try:
        return model.model_validate({"schema": 1, **body})
    except ValidationError as exc:
        raise RecordError(f"{path} is not a {body['kind']} change record: {first_message(exc)}") from None


def write_record(path: Path, record: ChangeRecord | dict[str, Any]) -> None:
    body = record.to_file() if isinstance(record, ChangeRecord) else record
    write_atomically(path, orjson.dumps(body, option=orjson.OPT_INDENT_2, default=str))


def _state(view: EngineView) -> EngineState | Literal["UNREACHABLE"]:
    try:
        return EngineState(view.lifecycle)
    except ValueError:
        return "UNREACHABLE"


def engines_section(view: FleetView) -> list[EngineRecord]:
    return [
        EngineRecord(
            name=e.name,
            supervisor=e.supervisor_url,
            engine=e.engine_url,
            state=_state(e),
            epoch=(e.state or {}).get("epoch"),
            bundle=(e.state or {}).get("bundle"),
            models=e.base_models,
            adapters=e.adapters,
            sleeping=e.sleeping,
            health=e.health,
        )
        for e in view.engines
    ]


def new_record(view: FleetView, started: float, **sections: Any) -> VerifyRecord:
    """A verify's record of `view`: the fleet's members as they were, and the `sections` it measured."""
    return VerifyRecord(
        id=f"verify-{uuid.uuid4().hex[:10]}",
        corral_version=__version__,
        started=started,
        finished=time.time(),
        router=view.target.router,
        fleet_id=view.target.identity.id,
        fleet_run=view.target.identity.run,
        supervisors=[url for _, url in view.target.supervisors],
        engines=engines_section(view),
        **sections,
    )


def newest_record(
    records: Iterable[tuple[str, dict[str, Any] | None]],
    router: str | None,
    has: Callable[[dict[str, Any]], bool] = lambda record: True,
) -> tuple[str, dict[str, Any]] | None:
    """From (where, record) pairs, the newest (by `finished`) record for which `has` holds, skipping
    another router's records (when both say which): another fleet's record under the same port."""
    best: tuple[float, str, dict[str, Any]] | None = None
    for where, record in records:
        if record is None or not isinstance(record.get("finished"), int | float) or not has(record):
            continue
        if router and record.get("router") and str(record["router"]).rstrip("/") != router.rstrip("/"):
            continue
        if best is None or record["finished"] > best[0]:
            best = (float(record["finished"]), where, record)
    return (best[1], best[2]) if best is not None else None
