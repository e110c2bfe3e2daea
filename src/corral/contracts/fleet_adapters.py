"""A fleet's desired LoRA set: the union of its supervisors' `adapters.desired` (from `--lora` and runtime
loads), as a rollout's new group and the router's adapter carry (a pod that joins later) load it."""

from __future__ import annotations

from collections.abc import Iterable

from corral.contracts.supervisor import SupervisorState


class AdapterConflict(ValueError):
    """Two supervisors desire one adapter name from two paths: which one a new engine should load
    is not Corral's to guess."""


def fleet_adapter_set(states: Iterable[tuple[str, SupervisorState]]) -> dict[str, str]:
    """name -> path desired by any of the (member name, state) pairs; AdapterConflict naming the
    adapter, both paths and the members when two disagree on a path."""
    found: dict[str, tuple[str, str]] = {}  # name -> (path, the first member that desires it)
    for member, state in states:
        for name, path in state.adapters.desired.items():
            first = found.setdefault(name, (path, member))
            if first[0] != path:
                raise AdapterConflict(
                    f"adapter {name!r} is desired from {first[0]!r} on {first[1]} but from {path!r} on "
                    f"{member}; unload one (`POST /v1/lora/unload`) so the fleet has one path for it"
                )
    return {name: path for name, (path, _) in sorted(found.items())}
