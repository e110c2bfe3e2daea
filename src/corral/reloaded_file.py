"""A file a person edits while a process runs (the router's `--backends-file` and `--api-keys-file`):
polled by its stamp (`atomic_file.file_stamp`: modification time, size, inode), read again when the
stamp changes, and what it says handed on. A read that fails (a bad edit, the file gone) is reported
once per change and the last good content stays."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from corral.aio import cancel_tasks
from corral.atomic_file import file_stamp

T = TypeVar("T")


class ReloadedFile(Generic[T]):
    """Reads `path` again with `read` whenever its stamp changes and hands the result to `apply`; an
    exception of `errors` goes to `refused` instead. The owner's first read is `read_now`."""

    def __init__(
        self,
        path: Path,
        read: Callable[[Path], T],
        apply: Callable[[T], None],
        refused: Callable[[Exception], None],
        errors: tuple[type[Exception], ...],
        *,
        poll_seconds: float = 0.5,
        task_name: str,
    ) -> None:
        self.path = path
        self._read = read
        self._apply = apply
        self._refused = refused
        self._errors = errors
        self._poll_seconds = poll_seconds
        self._task_name = task_name
        self._stamp = file_stamp(path)
        self._task: asyncio.Task[None] | None = None

    def read_now(self) -> T:
        """The file's content now, its errors raised (a bad file at start is the user's to fix); the
        stamp is taken first, so a change made while it is read is seen at the next poll."""
        self._stamp = file_stamp(self.path)
        return self._read(self.path)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=self._task_name)

    async def stop(self) -> None:
        await cancel_tasks(self._task)
        self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            self.reload_if_changed()

    def reload_if_changed(self) -> bool:
        """Read the file again if it changed since the last look; True when its content was applied."""
        stamp = file_stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            content = self._read(self.path)
        except self._errors as exc:
            self._refused(exc)
            return False
        self._apply(content)
        return True
