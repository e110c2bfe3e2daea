"""Engines of a local fleet by the names `corral up` gives them (`engine-0`, …): `--port P --engine NAME`
on the supervisor's runbook commands and `corral logs`, resolved through the control API of the
`corral up` behind router port P (`GET /v1/groups`), which knows every engine it runs, and with what
supervisor and log. A client of that API, below both commands' packages."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson

from corral.clients.calls import APIError
from corral.clients.up import UpControlClient
from corral.contracts.up import GroupMember
from corral.state_home import local_fleet_file


class EngineNameError(ValueError):
    """The engine could not be found by name; the message says which exist or what to start."""


def _control_of(port: int) -> tuple[str, str]:
    """The control API URL and token of the local fleet behind router port `port`."""
    path = local_fleet_file(port)
    try:
        body = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise EngineNameError(
            f"no local fleet on port {port} ({path} does not exist): start one with `corral up --port "
            f"{port}`, or pass the fleet's router port with --port"
        ) from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise EngineNameError(f"cannot read the local fleet's file {path}: {exc}") from None
    control, token_file = body.get("control"), body.get("token_file")
    if not isinstance(control, str) or not isinstance(token_file, str):
        raise EngineNameError(
            f"the local fleet on port {port} is still starting (its control API is not up yet): "
            "try again once `corral up` says `fleet ready`"
        )
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise EngineNameError(f"cannot read the fleet's control token {token_file}: {exc.strerror}") from None
    return control, token


async def fleet_engines(port: int) -> list[GroupMember]:
    """Every engine of the local fleet behind router port `port`, in the order `corral up` named them."""
    control, token = _control_of(port)
    async with aiohttp.ClientSession() as session:
        try:
            listing = await UpControlClient(session, control, token).groups()
        except APIError as exc:
            gone = " (its `corral up` has stopped?)" if exc.unreachable else ""
            raise EngineNameError(f"the local fleet on port {port} does not answer{gone}: {exc}") from None
    members = [m for g in listing.groups for m in g.members]
    return sorted(members, key=lambda m: _number(m.name))


def _number(name: str) -> tuple[int, str]:
    _, _, tail = name.rpartition("-")
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)


async def find_engine(port: int, name: str) -> GroupMember:
    """The engine called `name` in the local fleet behind router port `port`."""
    members = await fleet_engines(port)
    for member in members:
        if member.name == name:
            return member
    known = ", ".join(m.name for m in members) or "none"
    raise EngineNameError(f"no engine {name!r} in the local fleet on port {port} (its engines: {known})")
