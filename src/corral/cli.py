"""The `corral` command line: one group, each subcommand owned by its component's package and imported
only when it runs, so `corral --help` and `corral status --help` start in a fraction of a second."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click

from corral import __version__


@dataclass(frozen=True)
class Subcommand:
    """Where a subcommand lives (`module:attribute`) and the line `corral --help` shows for it."""

    where: str
    summary: str

    def load(self) -> click.Command:
        module, _, attribute = self.where.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), self.where
        return command


_RUNBOOK = "corral.supervisor.commands.runbook_ops"

# In the order `corral --help` lists them (the fleet's daily commands first).
SUBCOMMANDS: dict[str, Subcommand] = {
    "up": Subcommand(
        "corral.fleet.local.up:up", "Start a local fleet: simulated engines and a router on loopback."
    ),
    "status": Subcommand(
        "corral.fleet.checks.status_cli:status",
        "Show every engine's lifecycle state, supervisor, bundle and load.",
    ),
    "doctor": Subcommand(
        "corral.fleet.checks.doctor_cli:doctor", "Say what is wrong with a fleet and the command to run next."
    ),
    "verify": Subcommand(
        "corral.fleet.checks.verify_cli:verify", "Check a fleet against the post-operation checklist."
    ),
    "sleep": Subcommand(
        f"{_RUNBOOK}:sleep_command", "Take an engine out of routing, drain it and put it to sleep."
    ),
    "wake": Subcommand(
        f"{_RUNBOOK}:wake_command", "Wake a sleeping engine, verify it and make it READY again."
    ),
    "reload": Subcommand(f"{_RUNBOOK}:reload_command", "Reload an engine's weights in place."),
    "lora": Subcommand(f"{_RUNBOOK}:lora_group", "Load or unload a LoRA adapter on an engine."),
    "switch-bundle": Subcommand(
        f"{_RUNBOOK}:switch_bundle_command", "Move an engine to another bundle declared on its host."
    ),
    "logs": Subcommand("corral.fleet.local.logs:logs", "Show an engine's log in a local fleet."),
    "rollout": Subcommand(
        "corral.fleet.rollout.cli:rollout", "Move a fleet to another bundle, one serving group at a time."
    ),
    "rollback": Subcommand(
        "corral.fleet.rollout.cli:rollback", "Move a fleet back to the bundle its last rollout started from."
    ),
    "load": Subcommand(
        "corral.fleet.load.cli:load", "Send a bounded demo load to a router and count what failed."
    ),
    "supervise": Subcommand(
        "corral.supervisor.cli:supervise", "Supervise one engine (the engine container's entrypoint)."
    ),
    "router": Subcommand("corral.router.cli:router", "Run the OpenAI-compatible router in front of a fleet."),
    "epp": Subcommand(
        "corral.epp.cli:epp", "Pick endpoints for a Gateway API inference gateway (an InferencePool's EPP)."
    ),
    "sim": Subcommand("corral.sim.cli:sim", "Run a vLLM-compatible engine simulator."),
    "k8s": Subcommand("corral.k8s.render.cli:k8s", "Render Kubernetes manifests for a Corral fleet."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use; its help lists them from `SUBCOMMANDS`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        sub = SUBCOMMANDS.get(cmd_name)
        return sub.load() if sub is not None else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, sub.summary) for name, sub in SUBCOMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def main() -> None:
    """Corral: run a fleet of vLLM engines safely through their whole life."""
