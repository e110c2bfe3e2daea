"""A request's place in the flow queue: its priority (its tenant's, or the header's where the tenant may
set it), its flow (the tenant; on an open router the fairness header's id), its weight and its deadline.

The headers are the client's input: parsed by bounded patterns (never `int()` of an unbounded digit
run); a bad value is a 400 that names the header, the value's fault and what to send instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from corral.router.flow.config import (
    DEADLINE_HEADER,
    FAIRNESS_HEADER,
    MAX_DEADLINE_MS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PRIORITY_HEADER,
)
from corral.router.flow.refusal import Refusal

_PRIORITY = re.compile(r"[+-]?[0-9]{1,4}")
_DEADLINE = re.compile(r"[0-9]{1,8}")
_FAIRNESS_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
OPEN_FLOW = "-"  # an open router's requests without a fairness id


class TenantFlow(Protocol):
    """What flow control reads of a tenant (corral.router.edge.tenants.Tenant)."""

    name: str
    priority: int
    max_priority: int | None
    weight: int
    deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class RequestClass:
    priority: int
    flow: str
    weight: int
    deadline_ms: int | None  # None: no deadline (orders last under `edf`)
    tenant: str  # the metrics label: the tenant's name, "" on an open router

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


def classify(headers: Mapping[str, str], tenant: TenantFlow | None) -> RequestClass | Refusal:
    """The request's class, or the 400 for a header it may not send or sent malformed."""
    deadline_ms: int | None = tenant.deadline_ms if tenant is not None else None
    raw = headers.get(DEADLINE_HEADER)
    if raw is not None:
        value = raw.strip()
        if not _DEADLINE.fullmatch(value) or not 1 <= int(value) <= MAX_DEADLINE_MS:
            return _bad(
                DEADLINE_HEADER,
                f"must be whole milliseconds from 1 to {MAX_DEADLINE_MS} (how soon the answer is wanted)",
            )
        deadline_ms = int(value)
    if tenant is None:
        flow = headers.get(FAIRNESS_HEADER, OPEN_FLOW).strip() or OPEN_FLOW
        if flow != OPEN_FLOW and not _FAIRNESS_ID.fullmatch(flow):
            return _bad(FAIRNESS_HEADER, "must be 1-64 letters, digits, '.', '_', ':' or '-'")
        if headers.get(PRIORITY_HEADER) is not None:
            return _bad(
                PRIORITY_HEADER,
                "is honoured only for a tenant allowed to set it (max_priority in --api-keys-file); "
                "this router has no tenants",
            )
        if flow == OPEN_FLOW and deadline_ms is None:
            return _OPEN_CLASS  # the common case, one object for all
        return RequestClass(0, flow, 1, deadline_ms, "")
    priority = tenant.priority
    raw = headers.get(PRIORITY_HEADER)
    if raw is not None:
        if tenant.max_priority is None:
            return _bad(
                PRIORITY_HEADER,
                f"tenant `{tenant.name}` may not set its priority (give it max_priority in the "
                "--api-keys-file)",
            )
        value = raw.strip()
        if not _PRIORITY.fullmatch(value) or not MIN_PRIORITY <= int(value) <= MAX_PRIORITY:
            return _bad(PRIORITY_HEADER, f"must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}")
        if int(value) > tenant.max_priority:
            return _bad(
                PRIORITY_HEADER,
                f"is above tenant `{tenant.name}`'s max_priority {tenant.max_priority}; send at most that",
            )
        priority = int(value)
    return RequestClass(priority, tenant.name, tenant.weight, deadline_ms, tenant.name)


_OPEN_CLASS = RequestClass(0, OPEN_FLOW, 1, None, "")


def _bad(header: str, fault: str) -> Refusal:
    return Refusal(400, f"The header `{header}` {fault}.", "invalid_request_error", header)
