"""The `corral` command line: one group, each subcommand owned by its component's package."""

from __future__ import annotations

import click

from corral import __version__
from corral.fleet.checks.doctor_cli import doctor
from corral.fleet.checks.status_cli import status
from corral.fleet.checks.verify_cli import verify
from corral.fleet.local.up import up
from corral.fleet.rollout.cli import rollback, rollout
from corral.k8s.render.cli import k8s
from corral.router.cli import router
from corral.sim.cli import sim
from corral.supervisor.cli import supervise
from corral.supervisor.commands.runbook_ops import RUNBOOK_COMMANDS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def main() -> None:
    """Corral: run a fleet of vLLM engines safely through their whole life."""


main.add_command(sim)
main.add_command(router)
main.add_command(up)
main.add_command(supervise)
main.add_command(status)
main.add_command(k8s)
main.add_command(verify)
main.add_command(doctor)
main.add_command(rollout)
main.add_command(rollback)
for command in RUNBOOK_COMMANDS:
    main.add_command(command)
