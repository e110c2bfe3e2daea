"""The leftover detectors on real things: child processes, Unix sockets bound in a temp dir, files with
the atomic writer's temp names. Each finds what is planted, names it, and is clean once it is gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from corral.atomic_file import temp_name, write_atomically
from corral.supervisor.checks.leftovers import (
    CPU_BACKUP,
    OLD_PROCESS,
    ORPHANED_DAEMON,
    STALE_SOCKET,
    TEMP_FILE,
    KnownProcess,
    RssProxy,
    Scene,
    cpu_backup,
    leftovers,
    old_processes,
    orphaned_daemons,
    runs_command,
    stale_sockets,
    temp_files,
    unix_listeners,
)

SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory short enough for AF_UNIX paths (108 bytes)."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="lo-") as d:
        yield Path(d)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(10)


def _spawn(children: list[subprocess.Popen[bytes]], argv: tuple[str, ...]) -> KnownProcess:
    """A child running `argv`, returned once it runs it: between fork and exec a child still shows its
    parent's command line, and a check made then would not see it (bounded wait)."""
    proc = subprocess.Popen(argv)
    children.append(proc)
    process = psutil.Process(proc.pid)
    deadline = time.monotonic() + 10
    while tuple(process.cmdline()) != argv and time.monotonic() < deadline:
        time.sleep(0.01)
    return KnownProcess(proc.pid, process.create_time(), "engine")


def _listener(children: list[subprocess.Popen[bytes]], path: Path) -> int:
    """A child process that binds and listens on `path` (a daemon holding its socket)."""
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "print('bound', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE)
    children.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"bound"
    return proc.pid


# -- old processes ------------------------------------------------------------------------------


def test_an_old_engine_still_alive_is_named_and_fails(children: list[subprocess.Popen[bytes]]) -> None:
    old = _spawn(children, SLEEPER)
    check = old_processes([old])
    assert check.verdict == "found" and check.fails
    assert check.found[0].pid == old.pid and f"pid {old.pid}" in check.reason
    assert check.found[0].bytes and check.found[0].bytes > 0  # its resident memory
    children[0].kill()
    children[0].wait(10)
    assert old_processes([old]).verdict == "clean"


def test_a_reused_pid_is_not_the_old_engine(children: list[subprocess.Popen[bytes]]) -> None:
    live = _spawn(children, SLEEPER)
    other = KnownProcess(live.pid, live.create_time - 100.0, "engine")  # same pid, another start
    assert old_processes([other]).verdict == "clean"


def test_a_process_running_the_engine_command_outside_the_engine_is_found(
    children: list[subprocess.Popen[bytes]],
) -> None:
    stray = _spawn(children, SLEEPER)
    found = old_processes([], engine_argvs={SLEEPER})
    assert found.verdict == "found" and [f.pid for f in found.found] == [stray.pid]
    assert old_processes([], engine_argvs={SLEEPER}, current={stray.pid}).verdict == "clean"


def test_nothing_known_is_not_measured_never_clean() -> None:
    assert old_processes([]).verdict == "not_measured"
    assert stale_sockets().verdict == "not_measured"
    assert cpu_backup(None).verdict == "not_measured"


def test_a_console_script_runs_its_command() -> None:
    argv = ("corral", "sim", "--port", "8000")
    assert runs_command(("/venv/bin/python", "/venv/bin/corral", "sim", "--port", "8000"), argv)
    assert not runs_command(("/venv/bin/python", "/venv/bin/corral", "sim", "--port", "8001"), argv)
    assert not runs_command(("sim", "--port", "8000"), argv)


# -- sockets ------------------------------------------------------------------------------------


def test_a_socket_file_nobody_listens_on_is_stale(short_dir: Path) -> None:
    path = short_dir / "dep.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    assert stale_sockets(served=[str(path)]).verdict == "clean"
    server.close()  # the file stays: what a killed process leaves
    check = stale_sockets(served=[str(path)])
    assert check.verdict == "found" and not check.fails
    assert check.found[0].path == str(path) and "nobody listens" in check.reason
    path.unlink()
    assert stale_sockets(served=[str(path)]).verdict == "clean"


def test_a_socket_of_a_stopped_process_must_be_gone(
    short_dir: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = short_dir / "engine.sock"
    pid = _listener(children, path)
    assert unix_listeners([pid]) == {str(path): pid}
    check = stale_sockets(gone=[str(path)])
    assert check.verdict == "found" and "still accepts connections" in check.reason
    assert stale_sockets(gone=[str(short_dir / "never.sock")]).verdict == "clean"


# -- the CPU backup -----------------------------------------------------------------------------


def test_cpu_backup_from_the_engine_figure() -> None:
    held = cpu_backup(2.0 * 2**30)
    assert held.verdict == "found" and held.fails and held.found[0].bytes == 2 * 2**30
    assert cpu_backup(0.0).verdict == "clean"


def test_cpu_backup_from_host_rss_is_a_proxy_that_only_warns() -> None:
    gib = 2**30
    assert cpu_backup(None, RssProxy(5 * gib, 1 * gib, 4 * gib)).verdict == "clean"
    kept = cpu_backup(None, RssProxy(5 * gib, 5 * gib, 4 * gib))
    assert kept.verdict == "found" and not kept.fails and "proxy" in kept.reason
    assert cpu_backup(None, RssProxy(5 * gib, 1 * gib, None)).verdict == "not_measured"


# -- preload daemons ----------------------------------------------------------------------------


def test_a_daemon_holding_the_socket_that_is_not_ours_is_orphaned(
    short_dir: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    path = short_dir / "vllm_weight_cache_x.sock"
    pid = _listener(children, path)
    check = orphaned_daemons(("corral", "sim", "preload"), [str(path)], own=())
    assert check.verdict == "found" and check.fails
    assert check.found[0].pid == pid and check.found[0].path == str(path)
    assert orphaned_daemons(("corral", "sim", "preload"), [str(path)], own={pid}).verdict == "clean"


def test_two_daemons_for_one_command_name_the_one_not_ours(children: list[subprocess.Popen[bytes]]) -> None:
    ours = _spawn(children, SLEEPER)
    other = _spawn(children, SLEEPER)
    check = orphaned_daemons(SLEEPER, [], own={ours.pid})
    assert [f.pid for f in check.found] == [other.pid]


# -- temp files ---------------------------------------------------------------------------------


def test_an_old_temp_file_of_an_atomic_write_is_named(tmp_path: Path) -> None:
    write_atomically(tmp_path / "adapters.json", b"{}")  # a finished write leaves none
    assert temp_files([tmp_path], min_age_s=0).verdict == "clean"
    stale = temp_name(tmp_path / "adapters.json")
    stale.write_bytes(b"x" * 10)
    assert temp_files([tmp_path]).verdict == "clean"  # young: may be a write in progress
    old = time.time() - 3600
    os.utime(stale, (old, old))
    check = temp_files([tmp_path])
    assert check.verdict == "found" and not check.fails
    assert check.found[0].path == str(stale) and check.found[0].bytes == 10
    assert temp_files([tmp_path / "absent"]).verdict == "not_measured"


# -- the aggregate ------------------------------------------------------------------------------


def test_the_report_fails_only_on_kinds_that_hold_memory(
    short_dir: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    dead = short_dir / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    scene = Scene(state_dirs=(short_dir,), served_sockets=(str(dead),), awake=True, cpu_backup_bytes=0.0)
    report = leftovers(scene)
    assert [c.kind for c in report.checks] == [OLD_PROCESS, STALE_SOCKET, CPU_BACKUP, TEMP_FILE]
    assert report.failures == [] and [c.kind for c in report.warnings] == [STALE_SOCKET]
    old = _spawn(children, SLEEPER)
    report = leftovers(Scene(state_dirs=(short_dir,), old=(old,), preload_argv=("no-such-daemon",)))
    assert [c.kind for c in report.failures] == [OLD_PROCESS]
    assert ORPHANED_DAEMON in [c.kind for c in report.checks]
    assert f"pid {old.pid}" in report.named(report.failures)
