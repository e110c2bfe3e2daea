"""What `corral epp` runs (corral.epp.cli holds its flags): the core's flags checked as the router checks
them, the picker's own added, and the picker served until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import click

from corral.epp.server import EppConfig, serve
from corral.router.core_config import core_config_of
from corral.router.edge.access_options import EdgeAccess


def start_epp(
    grpc_host: str,
    grpc_port: int,
    host: str,
    port: int,
    fallbacks: int,
    max_body_bytes: int,
    shutdown_timeout: float,
    log_level: str,
    access: EdgeAccess,
    **flags: Any,
) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if grpc_port and grpc_port == port:
        raise click.UsageError(f"--grpc-port {grpc_port} is the HTTP --port; give each its own.")
    core = replace(
        core_config_of(flags),
        api_keys_file=access.api_keys_file,
        admin=access.admin,
        engine_api_key=access.engine_api_key,
    )
    config = EppConfig(
        core=core,
        grpc_host=grpc_host,
        grpc_port=grpc_port,
        host=host,
        port=port,
        fallbacks=fallbacks,
        max_body_bytes=max_body_bytes,
    )
    # asyncio's own loop, not uvloop: grpc.aio's server does not serve streams on uvloop
    asyncio.run(serve(config, shutdown_timeout))
