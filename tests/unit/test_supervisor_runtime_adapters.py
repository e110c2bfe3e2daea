"""The runtime adapter file: written atomically, read back, and an unreadable one is moved aside
with a logged error and the `--lora` set alone, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.supervisor.checks.adapters import AdapterSet
from corral.supervisor.state.runtime_adapters import (
    FILE_NAME,
    RuntimeAdapterFile,
    restore_runtime_adapters,
)


def test_written_set_is_read_back_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = RuntimeAdapterFile(tmp_path)
    store.write({"b": "/adapters/b", "a": "/adapters/a"})
    assert store.read() == {"a": "/adapters/a", "b": "/adapters/b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]


def test_missing_file_is_an_empty_set(tmp_path: Path) -> None:
    logged: list[str] = []
    assert restore_runtime_adapters(RuntimeAdapterFile(tmp_path), {}, logged.append) == ({}, None)
    assert logged == []


@pytest.mark.parametrize(
    "content",
    [
        b'{"version": 1, "adapters": {"a": "/ad',  # torn write
        b"\x00\xff garbage",
        b'["a", "b"]',
        b'{"version": 7, "adapters": {}}',
        b'{"version": 1, "adapters": {"a": 3}}',
    ],
)
def test_unreadable_file_is_logged_moved_aside_and_the_cli_set_serves(tmp_path: Path, content: bytes) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    store = RuntimeAdapterFile(tmp_path)
    logged: list[str] = []
    runtime, error = restore_runtime_adapters(store, {"sql": "/adapters/sql"}, logged.append)
    assert runtime == {}
    assert error is not None and FILE_NAME in error and "corral lora load" in error
    assert logged == [error]
    assert not (tmp_path / FILE_NAME).exists()
    assert (tmp_path / (FILE_NAME + ".unreadable")).read_bytes() == content

    adapters = AdapterSet(desired={"sql": "/adapters/sql"})
    adapters.restore(runtime, store)
    assert adapters.desired == {"sql": "/adapters/sql"}
    adapters.add_runtime("new", "/adapters/new")  # the next load writes a fresh file
    assert store.read() == {"new": "/adapters/new"}


def test_cli_adapter_keeps_its_path_over_a_stored_one(tmp_path: Path) -> None:
    store = RuntimeAdapterFile(tmp_path)
    store.write({"sql": "/old/sql", "chat": "/adapters/chat"})
    logged: list[str] = []
    runtime, error = restore_runtime_adapters(store, {"sql": "/adapters/sql"}, logged.append)
    assert error is None
    assert runtime == {"chat": "/adapters/chat"}
    assert any("--lora" in line and "sql" in line for line in logged)


def test_unload_of_a_runtime_adapter_is_persisted_and_a_cli_one_is_not(tmp_path: Path) -> None:
    store = RuntimeAdapterFile(tmp_path)
    adapters = AdapterSet(desired={"sql": "/adapters/sql"})
    adapters.restore({}, store)
    adapters.add_runtime("chat", "/adapters/chat")
    assert store.read() == {"chat": "/adapters/chat"}
    adapters.remove("sql")
    assert adapters.desired == {"chat": "/adapters/chat"}
    adapters.remove("chat")
    assert adapters.desired == {} and store.read() == {}


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    store = RuntimeAdapterFile(tmp_path / "gone")  # its directory does not exist
    adapters = AdapterSet()
    adapters.restore({}, store)
    with pytest.raises(OSError):
        adapters.add_runtime("chat", "/adapters/chat")
    assert adapters.desired == {} and adapters.runtime == {}
