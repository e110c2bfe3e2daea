"""Management operations (drain, shutdown) made idempotent: an operation id names one run, and asking
again with the same id returns that run instead of starting another."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


class OperationConflict(Exception):
    """The operation id is already used by an operation of another kind."""


@dataclass
class Operation:
    id: str
    kind: str
    status: str = "running"  # running | succeeded | failed
    started: float = field(default_factory=time.time)
    finished: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def to_json(self) -> dict[str, Any]:
        return {
            "operation_id": self.id,
            "kind": self.kind,
            "status": self.status,
            "started": self.started,
            "finished": self.finished,
            "result": self.result,
            "error": self.error,
        }


OperationBody = Callable[[Operation], Awaitable[dict[str, Any]]]
OperationObserver = Callable[[Operation], None]


class OperationLedger:
    """Runs each operation once per id and keeps its record for `GET /v1/operations/{id}`."""

    def __init__(self, observer: OperationObserver) -> None:
        self._ops: dict[str, Operation] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._observer = observer

    def get(self, op_id: str) -> Operation | None:
        return self._ops.get(op_id)

    def all(self) -> list[Operation]:
        return list(self._ops.values())

    def start(self, kind: str, op_id: str | None, body: OperationBody) -> tuple[Operation, bool]:
        """Returns the operation and whether this call started it (False: the id was seen before)."""
        op_id = op_id or f"{kind}-{uuid.uuid4().hex[:12]}"
        existing = self._ops.get(op_id)
        if existing is not None:
            if existing.kind != kind:
                raise OperationConflict(f"operation id {op_id!r} is already a {existing.kind} operation")
            return existing, False
        op = Operation(op_id, kind)
        self._ops[op_id] = op
        self._observer(op)
        task = asyncio.create_task(self._run(op, body), name=f"operation:{kind}:{op_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return op, True

    async def _run(self, op: Operation, body: OperationBody) -> None:
        try:
            op.result = await body(op)
            op.status = "succeeded"
        except asyncio.CancelledError:
            op.status, op.error = "failed", "cancelled: the supervisor is exiting"
            raise
        except Exception as exc:
            op.status, op.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            op.finished = time.time()
            op.done.set()
            self._observer(op)
