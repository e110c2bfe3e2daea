"""The keys Corral's own CLIs carry to a locked-down fleet, and the one place they read the router's
admin routes.

A router bound beyond loopback answers `/v1/fleet` and `/metrics` only to its admin key, and with
`--admin-port` only there (corral.router.edge.admin_access); an engine started with vLLM's `--api-key`
answers its `/v1` routes only to that key. `router_admin_options` and `engine_key_option` add the
flags that name them to a command, which gets them as one `FleetAccess`; `RouterAdmin` reads the admin
routes and, when the router refuses, says which flag to pass. A router with tenants
(`--api-keys-file`) answers its OpenAI paths only to a tenant key: `router_headers` carries the one
named by `--router-api-key-file` to those paths (verify's smoke requests). Keys are never printed or
repr'd.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from corral.secret_file import SecretFileError, read_secret_file

if TYPE_CHECKING:
    import aiohttp

# aiohttp is imported where it is used: the CLIs import this module for their flags, and
# `corral status --help` must not pay for an HTTP client (bench_cli_startup.py)

ADMIN_KEY_FLAG = "--router-admin-key-file"
ADMIN_KEY_ENV = "CORRAL_ROUTER_ADMIN_KEY_FILE"
ADMIN_URL_FLAG = "--router-admin-url"
ROUTER_KEY_FLAG = "--router-api-key-file"
ROUTER_KEY_ENV = "CORRAL_ROUTER_API_KEY_FILE"
ENGINE_KEY_FLAG = "--engine-api-key-file"
ENGINE_KEY_ENV = "VLLM_API_KEY"  # what vLLM itself reads when it has no --api-key


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True)
class FleetAccess:
    """Where the router's admin routes are and the keys for them, for its OpenAI paths and for the
    engines."""

    router_admin_url: str | None = None  # the router's --admin-port listener, when it has one
    router_admin_key: str | None = field(default=None, repr=False)
    engine_key: str | None = field(default=None, repr=False)
    router_key: str | None = field(default=None, repr=False)  # a tenant's, from the router's --api-keys-file

    def router_headers(self) -> dict[str, str]:
        """For requests to the router's OpenAI paths only: never to an engine or a supervisor."""
        return bearer(self.router_key)

    def router_refused(self, status: int) -> str:
        """What to do when the router's OpenAI path answered `status` ("" when it is not a 401)."""
        if status != 401:
            return ""
        if self.router_key is None:
            return (
                f"the router wants a tenant key; pass {ROUTER_KEY_FLAG} FILE (or set {ROUTER_KEY_ENV}), "
                "FILE holding a key from the router's --api-keys-file"
            )
        return (
            f"the router refused the key in {ROUTER_KEY_FLAG}: it must be a key from the router's "
            "--api-keys-file"
        )

    def engine_headers(self) -> dict[str, str]:
        """For requests to an engine only: never to a router or a supervisor."""
        return bearer(self.engine_key)

    def router_admin(self, router_url: str) -> RouterAdmin:
        return RouterAdmin(router_url, self.router_admin_url, self.router_admin_key)


class RouterAdminError(RuntimeError):
    """The router's admin route did not answer; the message says what was seen and what to pass."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def refused(self) -> bool:
        """The router is up but would not show the route to us (a key or the admin port wanted)."""
        return self.status in (401, 403, 404)


@dataclass(frozen=True)
class RouterAdmin:
    """The router's `/v1/fleet` and `/metrics`, read with the admin key from its admin listener."""

    url: str  # the router's main URL (where clients send requests)
    admin_url: str | None = None
    key: str | None = field(default=None, repr=False)

    @property
    def base(self) -> str:
        return (self.admin_url or self.url).rstrip("/")

    async def get(self, session: aiohttp.ClientSession, path: str, within: float = 3.0) -> bytes:
        """The body of a 200; RouterAdminError for anything else."""
        import aiohttp

        where = f"router {self.base}: {path}"
        try:
            async with session.get(
                self.base + path, headers=bearer(self.key), timeout=aiohttp.ClientTimeout(total=within)
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RouterAdminError(f"{where}: unreachable ({type(exc).__name__})", None) from None
        if status == 200:
            return body
        raise RouterAdminError(f"{where} answered {status}{self._hint(status, body)}", status)

    async def endpoints(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        try:
            body = orjson.loads(await self.get(session, "/v1/fleet"))
        except orjson.JSONDecodeError:
            raise RouterAdminError(f"router {self.base}: /v1/fleet answered 200 but not JSON", 200) from None
        endpoints = body.get("endpoints", []) if isinstance(body, dict) else body
        return [e for e in endpoints if isinstance(e, dict)] if isinstance(endpoints, list) else []

    async def metrics(self, session: aiohttp.ClientSession) -> str:
        return (await self.get(session, "/metrics")).decode(errors="replace")

    def _hint(self, status: int, body: bytes) -> str:
        said = _error_message(body)
        said = f" ({said})" if said else ""
        if status == 401 and self.key is None:
            return (
                f": it is an admin route and this router wants its admin key: pass {ADMIN_KEY_FLAG} "
                f"FILE (or set {ADMIN_KEY_ENV}), FILE holding the key in the router's --admin-key-file"
            )
        if status == 401:
            return (
                f": the router refused the key in {ADMIN_KEY_FLAG}: it must hold the key in the "
                "router's --admin-key-file"
            )
        if status == 404:
            return (
                f"{said}; a router started with --admin-port serves its admin routes only there: pass "
                f"{ADMIN_URL_FLAG} http://HOST:ADMIN_PORT"
            )
        return said


def _error_message(body: bytes) -> str:
    """The router's own OpenAI-shaped error message, when it sent one (never a key: it has none)."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return str(error.get("message") or "")[:300] if isinstance(error, dict) else ""


def _read_key(path: Path | None, flag: str) -> str | None:
    if path is None:
        return None

    try:
        return read_secret_file(path, flag)
    except SecretFileError as exc:
        raise click.UsageError(str(exc)) from None


def fleet_access_options(engine_key: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add --router-admin-url, --router-admin-key-file and --router-api-key-file (and, with
    `engine_key`, --engine-api-key-file) to a command, which gets them as `access: FleetAccess`."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_access(
            *args: Any,
            router_admin_url: str | None,
            router_admin_key_file: Path | None,
            router_api_key_file: Path | None,
            engine_api_key_file: Path | None = None,
            **kwargs: Any,
        ) -> Any:
            if router_admin_url is not None and not router_admin_url.startswith(("http://", "https://")):
                raise click.BadParameter(
                    f"{router_admin_url!r} is not an http(s) URL; give e.g. http://HOST:ADMIN_PORT",
                    param_hint=ADMIN_URL_FLAG,
                )
            engine = _read_key(engine_api_key_file, ENGINE_KEY_FLAG)
            if engine is None and engine_key:
                engine = os.environ.get(ENGINE_KEY_ENV) or None
            access = FleetAccess(
                router_admin_url=router_admin_url.rstrip("/") if router_admin_url else None,
                router_admin_key=_read_key(router_admin_key_file, ADMIN_KEY_FLAG),
                engine_key=engine,
                router_key=_read_key(router_api_key_file, ROUTER_KEY_FLAG),
            )
            return command(*args, access=access, **kwargs)

        options = [
            click.option(
                ADMIN_URL_FLAG,
                "router_admin_url",
                default=None,
                help="URL of the router's --admin-port listener, when it serves /v1/fleet and /metrics "
                "there (default: the router URL).",
            ),
            click.option(
                ADMIN_KEY_FLAG,
                "router_admin_key_file",
                type=click.Path(dir_okay=False, path_type=Path),
                envvar=ADMIN_KEY_ENV,
                show_envvar=True,
                help="File with the router's admin key (its --admin-key-file), sent to /v1/fleet and "
                "/metrics only; needed when the router listens beyond loopback.",
            ),
            click.option(
                ROUTER_KEY_FLAG,
                "router_api_key_file",
                type=click.Path(dir_okay=False, path_type=Path),
                envvar=ROUTER_KEY_ENV,
                show_envvar=True,
                help="File with a tenant key of the router (one in its --api-keys-file), sent only to the "
                "router's OpenAI paths (verify's smoke requests), never printed.",
            ),
        ]
        if engine_key:
            options.append(
                click.option(
                    ENGINE_KEY_FLAG,
                    "engine_api_key_file",
                    type=click.Path(dir_okay=False, path_type=Path),
                    help=f"File with the engines' API key (their vLLM --api-key; else ${ENGINE_KEY_ENV}), "
                    "sent only to engines, never printed.",
                )
            )
        for option in reversed(options):
            with_access = option(with_access)
        return with_access

    return decorate
