"""`UpControlClient`: the control API of a running `corral up`, typed (its serving groups; starting
and retiring one)."""

from __future__ import annotations

import aiohttp

from corral.bundle_spec import BundleSpec
from corral.clients.calls import JSONCaller
from corral.contracts.up import AddGroupRequest, GroupList, RetiredGroup, ServingGroup

GROUP_START_GRACE = 60.0  # beyond the startup timeout: a fleet stops a failed group before it answers


class UpControlClient:
    def __init__(self, session: aiohttp.ClientSession, url: str, token: str, timeout: float = 10.0) -> None:
        self._api = JSONCaller(session, url, token, "fleet control", timeout)

    @property
    def url(self) -> str:
        return self._api.url

    def __repr__(self) -> str:
        return f"UpControlClient({self.url})"

    async def groups(self) -> GroupList:
        status, raw = await self._api.call("GET", "/v1/groups")
        return self._api.parse(GroupList, "/v1/groups", status, raw)

    async def add_group(
        self,
        bundle: BundleSpec,
        size: int,
        within: float,
        adapters: dict[str, str] | None = None,
        role: str = "both",
    ) -> ServingGroup:
        """Start a group of `role` serving `adapters` (None: the fleet's desired set); it answers once
        every member is READY, serves them and is routed (APIError 422 if not)."""
        body = AddGroupRequest(
            bundle=bundle.to_json(), size=size, startup_timeout=within, adapters=adapters, role=role
        ).to_wire()
        status, raw = await self._api.call(
            "POST", "/v1/groups", body, ok=(201,), within=within + GROUP_START_GRACE
        )
        return self._api.parse(ServingGroup, "/v1/groups", status, raw)

    async def retire_group(self, name: str, within: float) -> RetiredGroup:
        path = f"/v1/groups/{name}"
        status, raw = await self._api.call("DELETE", path, within=within)
        return self._api.parse(RetiredGroup, path, status, raw)
