"""Which engine command is the stable one a failing bundle is compared with: the last command that
reached READY under this supervisor when it was another bundle's, else the bundle that
`--on-startup-failure rollback=B` names (what the operator declared known-good); and the comparison of
their CUDA-graph and NCCL settings (corral.engine.graph_nccl_flags) for /v1/state and `corral doctor`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.engine.graph_nccl_flags import comparison, graph_nccl_settings
from corral.redaction import redact_argv, redact_env


@dataclass(frozen=True)
class EngineCommand:
    """A bundle as it starts the engine: its name, command and environment."""

    bundle: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, str]:
        return graph_nccl_settings(redact_argv(self.argv), redact_env(self.env))


def stable_command(
    running: EngineCommand, last_ready: EngineCommand | None, rollback: EngineCommand | None
) -> EngineCommand | None:
    """The stable command to compare `running` with; None when there is none other than itself."""
    for candidate in (last_ready, rollback):
        if candidate is not None and candidate.bundle != running.bundle:
            return candidate
    return None


def compare_with_stable(
    running: EngineCommand, last_ready: EngineCommand | None, rollback: EngineCommand | None
) -> dict[str, Any] | None:
    """The running bundle's graph/NCCL settings against the stable one's; None without a stable one."""
    stable = stable_command(running, last_ready, rollback)
    if stable is None:
        return None
    return comparison(running.bundle, running.settings(), stable.bundle, stable.settings())
