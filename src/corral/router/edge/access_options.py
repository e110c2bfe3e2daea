"""The `corral router` flags of who may use it — `--api-keys-file`, `--admin-key-file`, `--admin-port`,
`--admin-host`, `--engine-api-key-file` — checked at start (exit 2 with the file, entry and field at
fault, never a key) and handed to the command as one `access: EdgeAccess` argument. What checks
them (aiohttp's admin gate, the YAML tenants file) is imported when the router starts, so that
`corral router --help` starts fast."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from corral.router.edge.admin_access import AdminAccessConfig

log = logging.getLogger("corral.router")


@dataclass(frozen=True, slots=True)
class EdgeAccess:
    admin: AdminAccessConfig
    api_keys_file: Path | None = None
    engine_api_key: str | None = field(default=None, repr=False)

    def log_at_start(self) -> None:
        """Say how open the router is, once, as it starts."""
        from corral.router.edge.admin_access import is_loopback_host

        if self.api_keys_file is None:
            log.warning(
                "no --api-keys-file: the router serves every client without a key (local development "
                "only); give it --api-keys-file FILE before it faces anyone else"
            )
        admin = self.admin
        if admin.admin_port is not None:
            where = f"http://{admin.admin_host}:{admin.admin_port}"
        else:
            where = "the main port"
        loopback = is_loopback_host(admin.admin_host if admin.admin_port is not None else admin.host)
        if admin.admin_key_sha256 is not None:
            who = "with the admin key" + (", or from loopback" if loopback else "")
        elif loopback:
            who = "from loopback only"
        else:
            who = "to nobody (no --admin-key-file and not bound to loopback)"
        log.info("admin routes /metrics, /v1/fleet and /dashboard: on %s, %s", where, who)


def access_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the access flags to `command`, which gets them as `access: EdgeAccess` (and keeps `host`
    and `port`)."""

    @functools.wraps(command)
    def with_access(
        *args: Any,
        api_keys_file: Path | None,
        admin_key_file: Path | None,
        admin_port: int | None,
        admin_host: str,
        engine_api_key_file: Path | None,
        **kwargs: Any,
    ) -> None:
        from corral.router.edge.admin_access import AdminAccessConfig
        from corral.router.edge.tenants_file import TenantsFileError, read_tenants
        from corral.secret_file import SecretFileError, read_secret_file

        if api_keys_file is not None:
            try:
                read_tenants(api_keys_file)
            except TenantsFileError as exc:
                raise click.UsageError(f"--api-keys-file: {exc}") from None
        try:
            admin_key = read_secret_file(admin_key_file, "--admin-key-file") if admin_key_file else None
            engine_key = (
                read_secret_file(engine_api_key_file, "--engine-api-key-file")
                if engine_api_key_file
                else None
            )
        except SecretFileError as exc:
            raise click.UsageError(str(exc)) from None
        if admin_port is not None and admin_port == kwargs.get("port"):
            raise click.UsageError(
                f"--admin-port {admin_port} is the main --port; give the admin side its own."
            )
        access = EdgeAccess(
            api_keys_file=api_keys_file,
            admin=AdminAccessConfig(
                host=str(kwargs.get("host", "127.0.0.1")),
                admin_port=admin_port,
                admin_host=admin_host,
                admin_key_sha256=hashlib.sha256(admin_key.encode()).digest() if admin_key else None,
            ),
            engine_api_key=engine_key,
        )
        command(*args, access=access, **kwargs)

    options = [
        click.option(
            "--api-keys-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="YAML list of tenants {name, key | key_sha256, max_in_flight?, requests_per_minute?, "
            "models?}: every request needs `Authorization: Bearer <a tenant's key>` (401 otherwise), "
            "over a limit gets 429, a model outside `models` 404. Read again when it changes. "
            "Without it the router is open to anyone (local development).",
        ),
        click.option(
            "--admin-key-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="File with the admin key: /metrics and /v1/fleet answer a request bearing it from "
            "anywhere. Without the key they answer only loopback clients of a loopback-bound listener.",
        ),
        click.option(
            "--admin-port",
            type=click.IntRange(1, 65535),
            help="Serve /metrics and /v1/fleet on this port only (on --admin-host); the main port then "
            "answers them 404. /health is on both.",
        ),
        click.option(
            "--admin-host",
            default="127.0.0.1",
            show_default=True,
            help="Address of --admin-port; a non-loopback one needs --admin-key-file to be any use.",
        ),
        click.option(
            "--engine-api-key-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="File with the engines' API key (their vLLM --api-key): sent as `Authorization: Bearer` "
            "with every /v1/models probe and every forwarded request, in place of the client's.",
        ),
    ]
    for option in reversed(options):
        with_access = option(with_access)
    return with_access
