"""Who may use the router (`--api-keys-file`): the tenants, their keys and their limits.

The file is read by `tenants_file.py`; only SHA-256 digests of the keys are held. Finding a
request's tenant is one hash and one dict lookup. The file is read again whenever its modification
time, size or inode changes; a bad edit keeps the previous tenants (logged and counted, never with a
key in the message). Each tenant's state (requests in flight, its rate bucket, its counters) lives
across re-reads under the tenant's name.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from corral.metric_families import labelled_counter
from corral.openai_errors import error_response
from corral.reloaded_file import ReloadedFile
from corral.router.edge.tenants_file import (
    TenantsFileError,
    TenantSpec,
    key_digest,
    read_tenants,
    warn_if_readable,
)

log = logging.getLogger("corral.router.tenants")


CLIENT_CLOSED = 499


class Tenant:
    """One tenant's limits and live state: requests in flight, its rate bucket, its counters."""

    __slots__ = (
        "_tokens",
        "_updated",
        "deadline_ms",
        "in_flight",
        "max_in_flight",
        "max_priority",
        "models",
        "name",
        "priority",
        "rejected",
        "requests",
        "requests_per_minute",
        "weight",
    )

    def __init__(self, spec: TenantSpec) -> None:
        self.name = spec.name
        self.in_flight = 0
        self.requests: dict[int, int] = {}  # status code -> count
        self.rejected: dict[str, int] = {}  # reason (in_flight, rate, model) -> count
        self._tokens = float(spec.requests_per_minute or 0)
        self._updated = time.monotonic()
        self.max_in_flight: int | None = None
        self.requests_per_minute: int | None = None
        self.models: frozenset[str] | None = None
        self.priority = 0
        self.max_priority: int | None = None
        self.weight = 1
        self.deadline_ms: int | None = None
        self.apply(spec)

    def apply(self, spec: TenantSpec) -> None:
        """Take the limits of a (re-read) entry; what is in flight and the bucket's level carry over."""
        if spec.requests_per_minute is not None:
            if self.requests_per_minute is None:
                self._tokens = float(spec.requests_per_minute)
            self._tokens = min(self._tokens, float(spec.requests_per_minute))
        self.max_in_flight = spec.max_in_flight
        self.requests_per_minute = spec.requests_per_minute
        self.models = spec.models
        self.priority = spec.priority
        self.max_priority = spec.max_priority
        self.weight = spec.weight
        self.deadline_ms = spec.deadline_ms

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def over_in_flight(self) -> bool:
        return self.max_in_flight is not None and self.in_flight >= self.max_in_flight

    def take_token(self, now: float) -> float:
        """Spend one request of the rate bucket (a minute's worth, refilled continuously); 0 when
        spent, else the seconds until one is there again."""
        rate = self.requests_per_minute
        if rate is None:
            return 0.0
        per_second = rate / 60.0
        self._tokens = min(float(rate), self._tokens + (now - self._updated) * per_second)
        self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / per_second

    def count(self, code: int) -> None:
        self.requests[code] = self.requests.get(code, 0) + 1

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def retry_after_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))


class Tenants:
    """The tenants of one API keys file: looked up by key digest, re-read when the file changes."""

    def __init__(
        self, specs: Sequence[TenantSpec] = (), path: Path | None = None, poll_seconds: float = 0.5
    ) -> None:
        self._file = (
            ReloadedFile(
                path,
                read_tenants,
                self.reread,
                self.refused,
                (TenantsFileError,),
                poll_seconds=poll_seconds,
                task_name="corral-router-api-keys-file",
            )
            if path is not None
            else None
        )
        self._by_name: dict[str, Tenant] = {}
        self._by_digest: dict[bytes, tuple[bytes, Tenant]] = {}
        self._retired: dict[str, Tenant] = {}  # removed from the file: counters stay on /metrics
        self.file_errors = 0
        self._install(specs)

    @classmethod
    def from_file(cls, path: Path, poll_seconds: float = 0.5) -> Tenants:
        """Read the file now (a bad file raises TenantsFileError: the user's to fix at start); later,
        a bad edit keeps the last good tenants."""
        tenants = cls(path=path, poll_seconds=poll_seconds)
        assert tenants._file is not None
        tenants._install(tenants._file.read_now())
        warn_if_readable(path)
        return tenants

    def __len__(self) -> int:
        return len(self._by_digest)

    def _install(self, specs: Sequence[TenantSpec]) -> None:
        by_name: dict[str, Tenant] = {}
        by_digest: dict[bytes, tuple[bytes, Tenant]] = {}
        for spec in specs:
            tenant = self._by_name.get(spec.name)
            if tenant is None:
                tenant = Tenant(spec)
            else:
                tenant.apply(spec)
            by_name[spec.name] = tenant
            by_digest[spec.key_sha256] = (spec.key_sha256, tenant)
        for name, tenant in self._by_name.items():
            if name not in by_name:
                self._retired[name] = tenant
        for name in by_name:
            self._retired.pop(name, None)
        self._by_name, self._by_digest = by_name, by_digest

    def lookup(self, authorization: str | None) -> Tenant | None:
        """The tenant whose key is the bearer token of this Authorization header, or None."""
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        digest = key_digest(authorization[7:].strip())
        found = self._by_digest.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]

    def all(self) -> list[Tenant]:
        return [*self._by_name.values(), *self._retired.values()]

    # -- the file, read again when it changes (corral.reloaded_file) ---------------------------------

    async def start(self) -> None:
        if self._file is not None:
            await self._file.start()

    async def stop(self) -> None:
        if self._file is not None:
            await self._file.stop()

    def reload_if_changed(self) -> bool:
        return self._file is not None and self._file.reload_if_changed()

    def refused(self, exc: Exception) -> None:
        self.file_errors += 1
        log.error("%s; keeping the previous %d tenants", exc, len(self._by_digest))

    def reread(self, specs: list[TenantSpec]) -> None:
        self._install(specs)
        path = self._file.path if self._file is not None else None
        log.info("API keys file %s changed: %d tenants", path, len(specs))
        if not specs:
            log.warning("the API keys file %s names no tenant: every request gets 401", path)


TENANT_KEY = web.RequestKey("corral_tenant", Tenant)  # the Tenant a request was admitted as


def tenant_of(request: web.Request) -> Tenant | None:
    """The tenant this request was admitted as; None on an open router (no --api-keys-file)."""
    return request.get(TENANT_KEY)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TenantGate:
    """Admits a request as one tenant or answers it: 401 without a valid key, 429 over a limit.

    Limits apply to POSTs (the requests that reach an engine); the router's own GET /v1/models only
    needs the key. A request holds its tenant's in-flight slot until its last byte is relayed."""

    def __init__(self, tenants: Tenants) -> None:
        self.tenants = tenants
        self.auth_failures: dict[str, int] = {}

    def refuse_unauthenticated(self, headers: Mapping[str, str]) -> web.Response | None:
        """The 401 for a request without a valid key (counted), else None; for checks made before the
        request reaches the middleware, such as the answer to `Expect: 100-continue`."""
        header = headers.get("Authorization")
        if self.tenants.lookup(header) is None:
            return self._unauthenticated("invalid" if header else "missing")
        return None

    def admit(self, headers: Mapping[str, str], method: str) -> Tenant | web.Response:
        """The tenant a request is admitted as, holding an in-flight slot when it is a POST (give it
        back with `release`); or the 401/429 that ends the request."""
        header = headers.get("Authorization")
        tenant = self.tenants.lookup(header)
        if tenant is None:
            return self._unauthenticated("invalid" if header else "missing")
        if method != "POST":
            return tenant
        if tenant.over_in_flight():
            return self._limited(
                tenant,
                "in_flight",
                f"Tenant `{tenant.name}` already has {tenant.in_flight} requests in flight, its "
                "max_in_flight; retry after 1 s.",
                1,
            )
        wait = tenant.take_token(time.monotonic())
        if wait > 0:
            seconds = retry_after_seconds(wait)
            return self._limited(
                tenant,
                "rate",
                f"Tenant `{tenant.name}` is over its requests_per_minute "
                f"({tenant.requests_per_minute}); retry after {seconds} s.",
                seconds,
            )
        tenant.in_flight += 1
        return tenant

    @staticmethod
    def release(tenant: Tenant, code: int) -> None:
        """A POST admitted by `admit` was answered `code` (499: the client left)."""
        tenant.in_flight -= 1
        tenant.count(code)

    async def serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        admitted = self.admit(request.headers, request.method)
        if isinstance(admitted, web.Response):
            return admitted
        request[TENANT_KEY] = admitted
        if request.method != "POST":
            return await handler(request)
        code = 500
        try:
            response = await handler(request)
            code = response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        except asyncio.CancelledError:
            code = CLIENT_CLOSED
            raise
        finally:
            self.release(admitted, code)

    def _unauthenticated(self, reason: str) -> web.Response:
        self.auth_failures[reason] = self.auth_failures.get(reason, 0) + 1
        if reason == "missing":
            message = (
                "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY); this router's keys are in its --api-keys-file."
            )
        else:
            message = (
                "Incorrect API key provided. Use a key from this router's --api-keys-file, "
                "sent as Authorization: Bearer YOUR_KEY."
            )
        return error_response(
            401, message, "authentication_error", headers={"WWW-Authenticate": 'Bearer realm="corral-router"'}
        )

    @staticmethod
    def _limited(tenant: Tenant, reason: str, message: str, retry_after: int) -> web.Response:
        tenant.reject(reason)
        tenant.count(429)
        return error_response(429, message, "rate_limit_error", headers={"Retry-After": str(retry_after)})


class TenantCollector:
    """Per-tenant families for /metrics, labelled by the tenant's name (never its key)."""

    def __init__(self, gate: TenantGate) -> None:
        self._tenants = gate.tenants
        self._auth_failures = gate.auth_failures

    def collect(self) -> Iterator[Metric]:
        tenants = self._tenants.all()
        yield labelled_counter(
            "corral_router_tenant_requests",
            "Requests of each tenant answered, by tenant and status code (rejections included).",
            ["tenant", "code"],
            {(t.name, str(code)): n for t in tenants for code, n in t.requests.items()},
        )
        yield labelled_counter(
            "corral_router_tenant_rejected",
            "Requests of each tenant refused by its limits, by reason: in_flight (max_in_flight, 429), "
            "rate (requests_per_minute, 429), model (outside its models, 404).",
            ["tenant", "reason"],
            {(t.name, reason): n for t in tenants for reason, n in t.rejected.items()},
        )
        in_flight = GaugeMetricFamily(
            "corral_router_tenant_in_flight", "Requests of each tenant in flight.", labels=["tenant"]
        )
        for t in tenants:
            in_flight.add_metric([t.name], t.in_flight)
        yield in_flight
        yield labelled_counter(
            "corral_router_auth_failures",
            "Requests answered 401 for want of a valid key, by reason (missing, invalid).",
            ["reason"],
            {(reason,): n for reason, n in self._auth_failures.items()},
        )
        yield GaugeMetricFamily(
            "corral_router_tenants", "Tenants in the API keys file now in force.", value=len(self._tenants)
        )
        yield CounterMetricFamily(
            "corral_router_api_keys_file_errors",
            "Re-reads of the API keys file that failed (the previous tenants were kept).",
            value=self._tenants.file_errors,
        )
