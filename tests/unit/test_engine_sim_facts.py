"""What `corral sim` is as an engine, stated once in `corral.engine` (`sim_version`, `sim_tokenizer`,
`sim_chat`) so that the router and the supervisor read it without importing the simulator: the
simulator's own defaults must say the same."""

from __future__ import annotations

import dataclasses

import click

from corral.engine.sim_version import SIM_VLLM_VERSION
from corral.sim.cli import sim
from corral.sim.core.config import SimConfig


def _default(command: click.Command, name: str) -> object:
    return next(p.default for p in command.params if p.name == name)


def test_the_simulator_reports_the_version_precheck_predicts_for_it() -> None:
    # sim/cli.py and sim/core/config.py still write the number themselves (issue 31: they were being
    # edited when it moved); this keeps every copy equal to the one PRECHECK reads until they import it
    assert _default(sim, "version_string") == SIM_VLLM_VERSION
    assert (
        next(f.default for f in dataclasses.fields(SimConfig) if f.name == "version_string")
        == SIM_VLLM_VERSION
    )
    for command in sim.commands.values():
        if any(p.name == "version_string" for p in command.params):
            assert _default(command, "version_string") == SIM_VLLM_VERSION, command.name
