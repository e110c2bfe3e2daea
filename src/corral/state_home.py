"""Where Corral keeps state that outlives a process: `$XDG_STATE_HOME/corral` (default ~/.local/state),
the local fleets' files there (`up-PORT.json`) and the supervisor tokens they name, and the check that
a state directory can be used at all, made before anything is started."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

import orjson


def corral_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "corral"


def local_fleet_file(router_port: int) -> Path:
    """The file `corral up` writes and `corral status` reads for the fleet behind that router port."""
    return corral_state_dir() / f"up-{router_port}.json"


def read_supervisor_token(fleet: object, where: Path) -> str | None:
    """The supervisors' token a fleet file names (`supervisor_token_file`), or None when it names
    none. Raises ValueError saying which file cannot be read."""
    if not isinstance(fleet, dict) or not fleet.get("supervisor_token_file"):
        return None
    path = Path(str(fleet["supervisor_token_file"]))
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"the supervisor token file {path} named by {where} is unreadable: "
            f"{getattr(exc, 'strerror', None) or exc}"
        ) from None
    if not token:
        raise ValueError(f"the supervisor token file {path} named by {where} is empty")
    return token


def fleet_listing(supervisor_url: str, state_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The fleet file (path and body) of the running local fleet (`corral up`) that lists
    `supervisor_url`, or None when none does (a missing or half-written file lists nothing)."""
    url = supervisor_url.rstrip("/")
    for path in sorted(state_dir.glob("up-*.json")):
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            body = orjson.loads(path.read_bytes())
            engines = body.get("engines") if isinstance(body, dict) else None
            listed = {str(e.get("supervisor")).rstrip("/") for e in engines or [] if isinstance(e, dict)}
            if url in listed:
                return path, body
    return None


def supervisor_token_for(supervisor_url: str, state_dir: Path) -> str | None:
    """The token of the running local fleet (`corral up`) whose fleet file lists `supervisor_url`,
    or None when no fleet file does."""
    found = fleet_listing(supervisor_url, state_dir)
    return read_supervisor_token(found[1], found[0]) if found is not None else None


def state_dir_problem(path: Path) -> str | None:
    """Why `path` cannot hold state (it is created, owner-only, when missing), or None when a file
    can be created, read back and removed there."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = path / f".probe-{secrets.token_hex(6)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
        os.listdir(path)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        return f"{exc.strerror or exc}{where}"
    return None
