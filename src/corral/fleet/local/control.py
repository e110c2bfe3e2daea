"""The control API of a running `corral up`: what `corral rollout` and `corral rollback` use to start
and retire serving groups in a fleet whose processes `up` owns.

It binds loopback only and always wants the bearer token `up` writes (mode 0600) beside its fleet
file: starting processes is not something any local user should be able to ask for.

    GET    /v1/groups          every serving group: its bundle and members
    POST   /v1/groups          {"bundle": {...}, "size": N, "startup_timeout": S, "adapters":
                               {NAME: PATH}, "role": prefill|decode|both}: start a group (of that
                               role; absent: both); 201 once every member is READY and
                               serves the adapters (absent: every serving group's desired set),
                               and is listed in the router's backends; 422 with the reason if not
    DELETE /v1/groups/{name}   drop the group from the router's backends and stop its members
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from corral.atomic_file import write_atomically
from corral.bundle_spec import BundleError, bundle_from_json
from corral.contracts.up import AddGroupRequest
from corral.contracts.wire import first_message
from corral.engine.pd_protocol import ROLES
from corral.fleet.local.fleet import NO_LOCAL_DAEMON, FleetStartError, LocalFleet


def write_token_file(path: Path) -> str:
    """A new random token in `path`, readable by its owner only (written whole, then renamed)."""
    token = secrets.token_urlsafe(32)
    write_atomically(path, (token + "\n").encode(), mode=0o600)
    return token


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": {"message": message, "code": status}}, status)


class FleetControl:
    def __init__(self, fleet: LocalFleet, token: str) -> None:
        self.fleet = fleet
        self._token = token
        self._runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/v1/groups", self.groups)
        app.router.add_post("/v1/groups", self.add_group)
        app.router.add_delete("/v1/groups/{name}", self.retire_group)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip(), self._token):
            return _error(401, "missing or wrong bearer token: read it from the fleet's token_file")
        response: web.StreamResponse = await handler(request)
        return response

    async def start(self, host: str = "127.0.0.1") -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, 0).start()  # the kernel picks the port: no race for it
        port = self._runner.addresses[0][1]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _groups_json(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "bundle": members[0].bundle.to_json() if members[0].bundle else None,
                "role": members[0].role,
                "members": [m.to_json() for m in members],
            }
            for name, members in self.fleet.groups().items()
        ]

    async def groups(self, request: web.Request) -> web.Response:
        return _json({"router": self.fleet.router_url, "groups": self._groups_json()})

    async def add_group(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"body is not JSON: {exc}")
        if not isinstance(body, dict) or "bundle" not in body:
            return _error(400, 'write {"bundle": {"name": ..., "engine_args": [...]}, "size": N}')
        try:
            asked = AddGroupRequest.model_validate(body)
        except ValidationError as exc:
            return _error(400, first_message(exc))
        if asked.role not in ROLES:
            return _error(400, f"role {asked.role!r}: one of {', '.join(ROLES)} (or leave it out: both)")
        size = asked.size if asked.size is not None else self.fleet.spec.group_size
        within = asked.startup_timeout
        try:
            bundle = bundle_from_json(asked.bundle, "bundle")
        except BundleError as exc:
            return _error(400, str(exc))
        if bundle.command:
            return _error(400, "bundle.command: a local fleet runs `corral sim`; give engine_args only")
        if bundle.preload_command:
            return _error(400, NO_LOCAL_DAEMON)
        try:
            group = await self.fleet.add_group(bundle, size, within, asked.adapters, asked.role)
        except FleetStartError as exc:
            return _error(422, str(exc))
        return _json(
            {
                "name": group[0].group,
                "bundle": bundle.to_json(),
                "role": asked.role,
                "members": [m.to_json() for m in group],
            },
            201,
        )

    async def retire_group(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            codes = await self.fleet.retire_group(name)
        except KeyError:
            known = ", ".join(self.fleet.groups()) or "none"
            return _error(404, f"no serving group {name!r} in this fleet (groups: {known})")
        return _json({"name": name, "exit_codes": codes})
