"""`corral sim`: run one vLLM-compatible engine simulator process."""

from __future__ import annotations

import sys

import click

from corral import aio
from corral.sim.config import SimConfig
from corral.sim.requires import Requirement
from corral.sim.server import SimServer


def _check_requires(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for spec in value:
        try:
            Requirement.parse(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option("--model", default="sim-model", show_default=True, help="Served model name.")
@click.option("--max-model-len", default=2048, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--max-num-seqs",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Running slots; more requests wait in a FIFO queue.",
)
@click.option("--block-size", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--kv-cache-blocks", default=4096, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--startup-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Time from start to serving; the port is not bound before.",
)
@click.option("--prefill-ms-per-token", default=0.05, show_default=True, type=click.FloatRange(min=0))
@click.option("--ttft-base-ms", default=1.0, show_default=True, type=click.FloatRange(min=0))
@click.option(
    "--itl-ms",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Inter-token latency of a lone request (grows with the batch).",
)
@click.option(
    "--default-max-tokens",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Upper bound of the drawn output length when a request gives no max_tokens.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--shutdown-timeout",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM, let in-flight requests finish for this long, then abort the rest.",
)
@click.option(
    "--fail-rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fraction of inference requests answered 500.",
)
@click.option(
    "--crash-after",
    default=None,
    type=click.IntRange(min=0),
    help="Exit 1 when the (N+1)-th inference request arrives.",
)
@click.option(
    "--hang-after",
    default=None,
    type=click.IntRange(min=0),
    help="Inference requests after the N-th never produce a token (/health stays 200).",
)
@click.option(
    "--requires",
    "requires",
    multiple=True,
    callback=_check_requires,
    metavar="SPEC",
    help="unix:/path, tcp:host:port, file:/path or a path that must be there at engine init.",
)
@click.option("--version-string", default="0.33.0", show_default=True, help="What /version reports.")
def sim(**options: object) -> None:
    """Run a vLLM-compatible engine simulator."""
    config = SimConfig(**options)  # type: ignore[arg-type]
    sys.exit(aio.run(SimServer(config).run()))
