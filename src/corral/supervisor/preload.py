"""The preload daemon as the supervisor's second child (`corral supervise --preload-command CMD
--preload-health URL`): it starts first, the engine only once its health answers 200 (a dependency
gate, checked again before every engine restart, so a restart reuses the running daemon), and at
shutdown it stops only after the engine, whose weights may be mapped from its memory.

A disk fallback of the engine's weight load is recorded as `engine_evidence` (kind `fallback`, see
`corral.supervisor.evidence`) and counted in `/v1/state`; it is never silent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from corral.child_process import ChildProcess, LineSink

Record = Callable[..., Any]


class PreloadDaemon:
    def __init__(self, argv: Sequence[str], echo: LineSink) -> None:
        self.argv = list(argv)
        self._child = ChildProcess("preload", self.argv, sink=echo)

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child.running

    async def start(self, record: Record) -> None:
        await self._child.start()
        record("preload_started", pid=self._child.pid, argv=self.argv)

    async def stop(self, grace_seconds: float, record: Record) -> int | None:
        was_running = self._child.running
        code = await self._child.stop(grace_seconds)
        if was_running:
            record("preload_stopped", pid=self._child.pid, exit_code=code)
        return code

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "running": self.running, "argv": self.argv}
