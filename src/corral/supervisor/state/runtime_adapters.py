"""The LoRA adapters loaded at run time (`POST /v1/lora/load`), kept in `--state-dir` so that a
restarted supervisor loads them again: written atomically (temp file, fsync, rename, fsync of the
directory) after every load and unload, read when the supervisor opens its state dir.

An unreadable file never stops a supervisor: it is moved aside, the error is logged with what to do,
and the engine gets the `--lora` set alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from corral.atomic_file import write_atomically
from corral.supervisor.state.state_writes import StateWriteFailures

FILE_NAME = "runtime_adapters.json"
FORMAT_VERSION = 1


class RuntimeAdaptersUnreadable(Exception):
    """The state dir's runtime adapter file exists but is not a set this supervisor wrote."""


class RuntimeAdapterFile:
    def __init__(self, state_dir: Path, failures: StateWriteFailures | None = None) -> None:
        self.path = state_dir / FILE_NAME
        self._failures = failures  # where a failed write is counted (and fails /livez)

    def read(self) -> dict[str, str]:
        """name → path; empty when there is no file. Raises `RuntimeAdaptersUnreadable`."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise RuntimeAdaptersUnreadable(f"{self.path}: {exc}") from exc
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise RuntimeAdaptersUnreadable(f"{self.path}: not JSON ({exc})") from exc
        return _adapters_of(body, self.path)

    def write(self, adapters: dict[str, str]) -> None:
        """Replace the file with `adapters`, durable before this returns. Raises OSError."""
        body = orjson.dumps(
            {"version": FORMAT_VERSION, "adapters": dict(sorted(adapters.items()))},
            option=orjson.OPT_INDENT_2,
        )
        try:
            write_atomically(self.path, body, durable=True, make_dirs=False)
        except OSError as exc:
            if self._failures is not None:
                self._failures.failed(str(self.path), exc)
            raise
        if self._failures is not None:
            self._failures.succeeded(str(self.path))

    def move_aside(self) -> Path | None:
        """Keep an unreadable file for inspection instead of overwriting it later."""
        aside = self.path.with_name(FILE_NAME + ".unreadable")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside


def _adapters_of(body: Any, path: Path) -> dict[str, str]:
    if not isinstance(body, dict) or body.get("version") != FORMAT_VERSION:
        raise RuntimeAdaptersUnreadable(
            f"{path}: expected {{'version': {FORMAT_VERSION}, 'adapters': {{NAME: PATH}}}}, "
            f"got {str(body)[:200]!r}"
        )
    adapters = body.get("adapters")
    if not isinstance(adapters, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in adapters.items()
    ):
        raise RuntimeAdaptersUnreadable(
            f"{path}: 'adapters' must map adapter names to paths, got {str(adapters)[:200]!r}"
        )
    return dict(adapters)


def restore_runtime_adapters(
    store: RuntimeAdapterFile,
    from_cli: dict[str, str],
    log: Callable[[str], None],
) -> tuple[dict[str, str], str | None]:
    """The runtime adapters to load again beside `--lora` ones (a `--lora` name keeps its path), and
    the error when the file could not be read (the caller records it; the set is then empty)."""
    try:
        stored = store.read()
    except RuntimeAdaptersUnreadable as exc:
        aside = store.move_aside()
        kept = f"moved to {aside}" if aside is not None else "left in place (could not move it)"
        error = (
            f"runtime LoRA adapters not restored: {exc}; the file was {kept}; serving the --lora set "
            "only; load the adapters again with `corral lora load` if they are still wanted"
        )
        log(error)
        return {}, error
    runtime: dict[str, str] = {}
    for name, path in stored.items():
        if name in from_cli:
            if from_cli[name] != path:
                log(f"runtime adapter {name!r} ({path}) is also given by --lora: {from_cli[name]} wins")
            continue
        runtime[name] = path
    if runtime:
        log(f"runtime LoRA adapters restored from {store.path}: {sorted(runtime)}")
    return runtime, None
