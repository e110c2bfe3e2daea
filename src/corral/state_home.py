"""Where Corral keeps state that outlives a process: `$XDG_STATE_HOME/corral` (default ~/.local/state)."""

from __future__ import annotations

import os
from pathlib import Path


def corral_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "corral"


def local_fleet_file(router_port: int) -> Path:
    """The file `corral up` writes and `corral status` reads for the fleet behind that router port."""
    return corral_state_dir() / f"up-{router_port}.json"


def local_fleet_token_file(router_port: int) -> Path:
    """The bearer token of that fleet's control API (mode 0600), which `corral rollout` reads."""
    return corral_state_dir() / f"up-{router_port}.token"
