"""`corral router`: parse the flags, run the router app on uvloop, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

import click
from aiohttp import web

from corral import aio
from corral.router.app import RouterConfig, build_app
from corral.router.policies import POLICY_NAMES

log = logging.getLogger("corral.router")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    required=True,
    help="Engine base URL, e.g. http://127.0.0.1:9001 (repeat for each engine).",
)
@click.option("--policy", type=click.Choice(POLICY_NAMES), default="round_robin", show_default=True)
@click.option(
    "--session-header",
    default="x-session-id",
    show_default=True,
    help="Header whose value keys session affinity (policy `session`).",
)
@click.option(
    "--max-retries",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="Other endpoints to try when one fails before sending any byte.",
)
@click.option(
    "--eject-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="How long a failed endpoint is ejected; doubles on each failure in a row.",
)
@click.option(
    "--models-refresh-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="How often each backend's /v1/models is asked (in the background).",
)
@click.option(
    "--request-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a backend may stay silent (before its first byte: eject and retry elsewhere; "
    "mid-stream: end the stream with an error event). Must exceed the longest non-streamed "
    "generation. 0 turns it off.",
)
@click.option(
    "--shutdown-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds open requests get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def router(
    host: str,
    port: int,
    backends: tuple[str, ...],
    policy: str,
    session_header: str,
    max_retries: int,
    eject_seconds: float,
    models_refresh_seconds: float,
    request_timeout: float,
    shutdown_timeout: float,
    log_level: str,
) -> None:
    """Run the OpenAI-compatible router in front of a fleet of engines."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = RouterConfig(
        backends=backends,
        policy=policy,
        session_header=session_header.lower(),
        max_retries=max_retries,
        eject_seconds=eject_seconds,
        models_refresh_seconds=models_refresh_seconds,
        request_timeout=request_timeout or None,
    )
    aio.run(serve(config, host, port, shutdown_timeout))


async def serve(config: RouterConfig, host: str, port: int, shutdown_timeout: float) -> None:
    runner = web.AppRunner(
        build_app(config),
        access_log=None,
        handler_cancellation=True,  # a client that hangs up cancels its upstream request
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
        await site.start()
        log.info(
            "corral router ready on http://%s:%d (policy %s, %d backends)",
            host,
            port,
            config.policy,
            len(config.backends),
        )
        await stop.wait()
        log.info("corral router stopping")
    finally:
        await runner.cleanup()
