"""LoRA adapters carried onto a new serving group before the router hears of it: each adapter of the
fleet's desired set loaded through each new member's supervisor (`POST /v1/lora/load`, so it joins
that supervisor's runtime set and outlives its restarts; the load's VERIFY finds it in the engine's
`/v1/models` and gets a smoke answer from it), then looked for in the supervisor's served list."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable

import aiohttp

from corral.clients.calls import APIError
from corral.clients.supervisor import OperationStillRunning, SupervisorClient
from corral.contracts.fleet_adapters import AdapterConflict, fleet_adapter_set
from corral.contracts.operations import LoadAdapterRequest
from corral.contracts.supervisor import SupervisorState

LOAD_SECONDS = 120.0  # one adapter's load operation on one supervisor
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")  # an operation id goes into /v1/operations/{id}


class AdapterCarryFailed(RuntimeError):
    """An adapter could not be loaded on (or is not served by) a new member; the message names both."""


async def desired_adapters(
    session: aiohttp.ClientSession, supervisors: Iterable[tuple[str, str]], token: str | None
) -> dict[str, str]:
    """The union of the desired adapter sets of the (member name, supervisor URL) pairs;
    AdapterCarryFailed when one cannot say or two disagree on an adapter's path."""
    pairs = list(supervisors)

    async def state(name: str, url: str) -> tuple[str, SupervisorState]:
        try:
            return name, await SupervisorClient(session, url, token).state()
        except APIError as exc:
            raise AdapterCarryFailed(
                f'{name}\'s adapters are unknown ({exc}); say which to load with "adapters": '
                "{NAME: PATH} in the request"
            ) from None

    states = await asyncio.gather(*(state(n, u) for n, u in pairs))
    try:
        return fleet_adapter_set(states)
    except AdapterConflict as exc:
        raise AdapterCarryFailed(str(exc)) from None


async def carry_adapters(
    session: aiohttp.ClientSession,
    members: Iterable[tuple[str, str]],
    adapters: dict[str, str],
    token: str | None,
    operation: str,
) -> dict[str, list[str]]:
    """Load every adapter of `adapters` (name -> path) on every (member name, supervisor URL),
    members at once and each member's adapters in turn; member name -> the adapters its engine
    then serves (none asked when `adapters` is empty). AdapterCarryFailed names the
    adapter and the member that failed."""
    if not adapters:
        return {}

    async def one(name: str, supervisor: str) -> tuple[str, list[str]]:
        client = SupervisorClient(session, supervisor, token)
        for adapter, path in sorted(adapters.items()):
            request = LoadAdapterRequest(
                name=adapter, path=path, operation_id=_UNSAFE.sub("-", f"{operation}-lora-{adapter}")[:120]
            )
            try:
                record = await client.run(request, within=LOAD_SECONDS)
            except OperationStillRunning:
                raise AdapterCarryFailed(
                    f"adapter {adapter!r} ({path}) still loading on {name} after {LOAD_SECONDS:g}s"
                ) from None
            except APIError as exc:
                raise AdapterCarryFailed(
                    f"adapter {adapter!r} ({path}) could not be loaded on {name}: {exc}"
                ) from None
            if not record.succeeded:
                raise AdapterCarryFailed(
                    f"adapter {adapter!r} ({path}) could not be loaded on {name}: {record.error}"
                )
        try:
            served = (await client.state()).adapters.served
        except APIError as exc:
            raise AdapterCarryFailed(f"{name}'s adapters could not be listed: {exc}") from None
        missing = sorted(set(adapters) - set(served))
        if missing:
            raise AdapterCarryFailed(
                f"adapters {missing} loaded on {name} but not in its supervisor's list of what it serves"
            )
        return name, served

    return dict(await asyncio.gather(*(one(*m) for m in members)))
