"""One look at a fleet for `corral verify` and `corral doctor`: every supervisor's `/v1/state`, every
engine's `/health`, `/is_sleeping`, `/v1/models` and `/metrics`, and the router's `/v1/fleet`, asked
concurrently with short timeouts so one hung member shows as such instead of stalling the look.

`FleetTarget` says where the fleet is: the file `corral up` writes, or URLs given on the command line,
with the keys a locked-down router and keyed engines want (`corral.clients.access`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from corral.clients.access import ENGINE_KEY_ENV, ENGINE_KEY_FLAG, FleetAccess, RouterAdminError
from corral.clients.router import RouterAdminClient
from corral.contracts.router import FleetEndpoint, ModelPairs
from corral.engine.metrics_text import Sample, samples
from corral.fleet_identity import FleetIdentity, FleetIdError
from corral.router.edge.admin_access import is_loopback_host
from corral.state_home import local_fleet_file, read_supervisor_token
from corral.supervisor_tokens import TokenFileError, read_management_token

_TIMEOUT = aiohttp.ClientTimeout(total=3)


class TargetError(RuntimeError):
    """The fleet could not be found; the message says what to pass instead."""


@dataclass(frozen=True)
class FleetTarget:
    router: str | None
    supervisors: list[tuple[str, str]]  # (name, supervisor URL)
    token: str | None = field(default=None, repr=False)
    access: FleetAccess = field(default_factory=FleetAccess)
    port: int | None = None  # the router port of a local fleet (`corral up`) the file named
    # its fleet id and run, from its fleet file: whose change records are its own
    identity: FleetIdentity = field(default_factory=lambda: FleetIdentity(None, None, "flags"))

    @property
    def cli_flags(self) -> str:
        """The flags that name this fleet to another `corral` command."""
        if self.port is not None:
            return f"--port {self.port}"
        named = " ".join(f"--supervisor {url}" for _, url in self.supervisors)
        return " ".join(part for part in (f"--router {self.router}" if self.router else "", named) if part)

    @classmethod
    def resolve(
        cls,
        port: int,
        router: str | None,
        supervisors: tuple[str, ...],
        token: str | None,
        access: FleetAccess | None = None,
    ) -> FleetTarget:
        access = access or FleetAccess()
        if supervisors or router:
            named = [(f"engine-{i}", u.rstrip("/")) for i, u in enumerate(supervisors)]
            return cls(router.rstrip("/") if router else None, named, token, access)
        path = local_fleet_file(port)
        try:
            body = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise TargetError(
                f"no local fleet on port {port} ({path} does not exist): start one with `corral up`, "
                "or name the fleet with --router URL and --supervisor URL"
            ) from None
        except orjson.JSONDecodeError as exc:
            raise TargetError(f"{path} is not valid JSON ({exc}); is it a Corral fleet file?") from None
        engines = [(str(e["name"]), str(e["supervisor"])) for e in body.get("engines", [])]
        try:
            identity = FleetIdentity.of_fleet_file(body, str(path))
        except FleetIdError as exc:
            raise TargetError(str(exc)) from None
        if token is None:  # the fleet's own supervisor token, which `corral up` made for it
            try:
                token = read_supervisor_token(body, path)
            except ValueError as exc:
                raise TargetError(str(exc)) from None
        return cls(body.get("router"), engines, token, access, port, identity)


@dataclass
class EngineView:
    """One engine as its supervisor and the engine itself describe it (None: did not answer)."""

    name: str
    supervisor_url: str | None
    engine_url: str | None
    state: dict[str, Any] | None = None
    state_error: str = ""
    health: int | None = None
    sleeping: bool | None = None
    models: list[dict[str, Any]] | None = None
    models_status: int | None = None  # what /v1/models answered (401: the engine wants its API key)
    metrics: str | None = None
    # the engine's own URL as its supervisor knows it, where the development endpoints (/is_sleeping,
    # /wake_up) answer: behind an admission gate `engine_url` is the gate, which does not forward them
    own_url: str | None = None
    local_port: int | None = None  # the router port of the local fleet that names this engine

    @property
    def cli_address(self) -> str:
        """The flags that name this engine to `corral sleep|wake|logs|…`: its name in a local fleet,
        else its supervisor's URL."""
        if self.local_port is not None and self.supervisor_url is not None:
            return f"--port {self.local_port} --engine {self.name}"
        return f"--supervisor {self.supervisor_url}"

    def logs_command(self) -> str:
        """The Corral command that shows why this engine failed: its log, or its supervisor's account."""
        if self.local_port is not None and self.supervisor_url is not None:
            return f"corral logs {self.cli_address}"
        return f"corral status --supervisor {self.supervisor_url} --json (reason, restarts, last lines)"

    @property
    def dev_url(self) -> str | None:
        return self.own_url or self.engine_url

    @property
    def lifecycle(self) -> str:
        return str((self.state or {}).get("state") or "UNREACHABLE")

    @property
    def base_models(self) -> list[str]:
        return sorted(str(m.get("id")) for m in self.models or [] if not m.get("parent"))

    @property
    def adapters(self) -> list[str]:
        return sorted(str(m.get("id")) for m in self.models or [] if m.get("parent"))

    @property
    def fingerprint(self) -> str | None:
        bundle = (self.state or {}).get("bundle") or {}
        value = bundle.get("fingerprint")
        return str(value) if value else None

    @property
    def evidence(self) -> dict[str, Any]:
        value = (self.state or {}).get("engine_evidence") or {}
        return value if isinstance(value, dict) else {}

    @property
    def models_problem(self) -> str:
        """Why /v1/models gave no list, with what to pass when it wanted a key ("" when it did)."""
        if self.models is not None:
            return ""
        if self.models_status == 401:
            return (
                f"{self.engine_url}/v1/models answered 401: the engine wants its API key (vLLM --api-key); "
                f"pass {ENGINE_KEY_FLAG} FILE or set {ENGINE_KEY_ENV}, or check that key if you did"
            )
        return f"{self.engine_url}/v1/models answered {self.models_status or 'nothing'}"

    def metric(self, name: str) -> list[Sample]:
        """Every sample of `name` in the engine's /metrics text (odd lines skipped)."""
        return list(samples(self.metrics or "", (name,)))


@dataclass
class FleetView:
    target: FleetTarget
    engines: list[EngineView] = field(default_factory=list)
    router_endpoints: list[FleetEndpoint] | None = None
    router_error: str = ""
    router_refused: bool = False  # the router is up but wants its admin key or admin URL
    router_metrics: str | None = None  # the router's /metrics text (None: not asked or no answer)
    router_pairs: list[ModelPairs] | None = None  # the router's P/D pairs per model (issue 16)

    def by_engine_url(self) -> dict[str, EngineView]:
        return {e.engine_url: e for e in self.engines if e.engine_url}


async def _get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int | None, bytes]:
    try:
        async with session.get(url, headers=headers or {}, timeout=_TIMEOUT) as resp:
            return resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return None, b""


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _reachable(own_url: str, supervisor_url: str) -> str | None:
    """The engine's own URL, unless it is on loopback while its supervisor is not (another machine's
    loopback: asking it here would reach whatever listens on this one)."""
    if not own_url:
        return None
    on_loopback = is_loopback_host(urlsplit(own_url).hostname or "")
    return own_url if not on_loopback or is_loopback_host(urlsplit(supervisor_url).hostname or "") else None


async def _look_at_engine(
    session: aiohttp.ClientSession, view: EngineView, token: str | None, access: FleetAccess
) -> None:
    if view.supervisor_url is not None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        status, raw = await _get(session, view.supervisor_url + "/v1/state", headers)
        body = _json(raw) if status == 200 else None
        if isinstance(body, dict):
            view.state = body
            view.own_url = _reachable(str((body.get("engine") or {}).get("url") or ""), view.supervisor_url)
            view.engine_url = view.engine_url or view.own_url
        else:
            view.state_error = f"/v1/state answered {status}" if status else "supervisor unreachable"
    if view.engine_url is None:
        return
    url, keyed = view.engine_url, access.engine_headers()
    (
        (health, _),
        (sleep_status, sleep_raw),
        (models_status, models_raw),
        (metrics_status, metrics_raw),
    ) = await asyncio.gather(
        _get(session, url + "/health", keyed),
        _get(session, (view.dev_url or url) + "/is_sleeping", keyed),
        _get(session, url + "/v1/models", keyed),
        _get(session, url + "/metrics", keyed),
    )
    view.health = health
    sleeping = _json(sleep_raw) if sleep_status == 200 else None
    view.sleeping = bool(sleeping.get("is_sleeping")) if isinstance(sleeping, dict) else None
    view.models_status = models_status
    models = _json(models_raw) if models_status == 200 else None
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        view.models = [m for m in models["data"] if isinstance(m, dict)]
    view.metrics = metrics_raw.decode(errors="replace") if metrics_status == 200 else None


async def look(target: FleetTarget) -> FleetView:
    """Everything the fleet's members say about themselves, right now."""
    view = FleetView(target)
    async with aiohttp.ClientSession() as session:
        if target.router:
            admin = RouterAdminClient(session, target.access.router_admin(target.router))
            try:
                fleet = await admin.fleet()
                view.router_endpoints, view.router_pairs = fleet.endpoints, fleet.pairs
                view.router_metrics = await admin.metrics()
            except RouterAdminError as exc:
                if view.router_endpoints is None:
                    view.router_error, view.router_refused = str(exc), exc.refused
        # the URL the router routes to for each supervisor's engine: its admission gate, if it has one
        routed = {e.supervisor_url: e.url for e in view.router_endpoints or [] if e.supervisor_url}
        view.engines = [
            EngineView(name, url, routed.get(url), local_port=target.port) for name, url in target.supervisors
        ]
        await asyncio.gather(
            *(_look_at_engine(session, e, target.token, target.access) for e in view.engines)
        )
        known = view.by_engine_url()
        extra = [
            EngineView(f"router:{e.url}", None, e.url)
            for e in view.router_endpoints or []
            if e.url and e.url not in known
        ]
        await asyncio.gather(*(_look_at_engine(session, e, None, target.access) for e in extra))
        view.engines += extra
    return view


def read_token(token_file: Path | None) -> str | None:
    """The token --token-file names, else $CORRAL_TOKEN (corral.supervisor_tokens); TargetError when
    the file is unreadable or empty."""
    try:
        return read_management_token(token_file)
    except TokenFileError as exc:
        raise TargetError(exc.naming("--token-file")) from None
