"""`RouterAdminClient`: the router's admin routes, typed: `/v1/fleet` as a `RouterFleet`, `/metrics`
as text. It reads them the way `RouterAdmin` does (admin listener, admin key, a refusal that names
the flag to pass)."""

from __future__ import annotations

import aiohttp
import orjson
from pydantic import ValidationError

from corral.clients.access import RouterAdmin, RouterAdminError
from corral.contracts.router import FleetEndpoint, RouterFleet
from corral.contracts.wire import first_message


class RouterAdminClient:
    def __init__(self, session: aiohttp.ClientSession, admin: RouterAdmin) -> None:
        self._session = session
        self.admin = admin

    def __repr__(self) -> str:  # never the key
        return f"RouterAdminClient({self.admin.base})"

    async def fleet(self, within: float = 3.0) -> RouterFleet:
        """`RouterAdminError` when the router does not answer 200 with a fleet body."""
        raw = await self.admin.get(self._session, "/v1/fleet", within)
        where = f"router {self.admin.base}: /v1/fleet answered 200 but"
        try:
            return RouterFleet.from_body(orjson.loads(raw))
        except orjson.JSONDecodeError:
            raise RouterAdminError(f"{where} not JSON", 200) from None
        except ValidationError as exc:
            raise RouterAdminError(f"{where} not a fleet: {first_message(exc)}", 200) from None

    async def endpoints(self, within: float = 3.0) -> dict[str, FleetEndpoint]:
        """Every endpoint the router lists, by URL."""
        return (await self.fleet(within)).by_url()

    async def metrics(self) -> str:
        return await self.admin.metrics(self._session)
