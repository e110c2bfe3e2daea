"""Change records: one JSON file per fleet operation (`verify`, later `rollout`/`rollback`) with every
step, its verdict and timing, so the next operation can compare against it and a person can audit it.
Written atomically (temp file, then rename)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from corral.atomic_file import write_atomically
from corral.fleet.checks.probe import FleetView
from corral.state_home import corral_state_dir


def default_record_path(kind: str, port: int) -> Path:
    return corral_state_dir() / f"{kind}-{port}.json"


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        body = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return body if isinstance(body, dict) else None


def write_record(path: Path, record: dict[str, Any]) -> None:
    write_atomically(path, orjson.dumps(record, option=orjson.OPT_INDENT_2, default=str))


def engines_section(view: FleetView) -> list[dict[str, Any]]:
    return [
        {
            "name": e.name,
            "supervisor": e.supervisor_url,
            "engine": e.engine_url,
            "state": e.lifecycle,
            "epoch": (e.state or {}).get("epoch"),
            "bundle": (e.state or {}).get("bundle"),
            "models": e.base_models,
            "adapters": e.adapters,
            "sleeping": e.sleeping,
            "health": e.health,
        }
        for e in view.engines
    ]


def new_record(kind: str, view: FleetView, started: float) -> dict[str, Any]:
    return {
        "kind": kind,
        "started": started,
        "finished": time.time(),
        "router": view.target.router,
        "supervisors": [url for _, url in view.target.supervisors],
        "engines": engines_section(view),
    }
