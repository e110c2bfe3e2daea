"""Two `scripts/bootstrap` at once (`scripts/up` and `scripts/test` started together) must not run two
pip installs into one venv: the second waits for the first, says so, and then finds the venv ready.

The real script runs, copied into a temporary project (its own `cd "$(dirname "$0")/.."` then puts
`.venv` there). That venv's `bin/python` is a stand-in for pip: it notes each install's start and end
in a log, and the `-e` install holds until the test lets it go, so both bootstraps are certainly in
flight together. A real install takes a minute; the lock is what is tested here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waits import wait_until

BOOTSTRAP = Path(__file__).resolve().parents[2] / "scripts" / "bootstrap"

# the venv's python: `-m pip install ...` prints pip-like lines, and the editable install waits for
# the file `release` (created by the test) so that it is still running when the second bootstrap starts
FAKE_PYTHON = """#!/usr/bin/env bash
here="$(cd "$(dirname "$0")/../.." && pwd)"
echo "start $$ $*" >>"$here/pip.log"
echo "Collecting orjson>=3"
echo "Collecting aiohttp>=3.9"
case "$*" in
  *" -e "*) while [ ! -e "$here/release" ]; do sleep 0.02; done ;;
esac
echo "Successfully installed aiohttp orjson"
echo "end $$" >>"$here/pip.log"
"""


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy2(BOOTSTRAP, project / "scripts" / "bootstrap")
    (project / "pyproject.toml").write_text("[project]\nname = 'stand-in'\n", encoding="utf-8")
    python = project / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON, encoding="utf-8")
    python.chmod(0o755)
    return project


def _log(project: Path) -> list[str]:
    path = project / "pip.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _start(project: Path, err: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(project / "scripts" / "bootstrap")],
        stdout=subprocess.DEVNULL,
        stderr=err.open("wb"),
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="scripts/bootstrap is a bash script")
def test_a_second_bootstrap_waits_for_the_first_and_finds_the_venv_ready(tmp_path: Path) -> None:
    project = _project(tmp_path)
    first_err, second_err = tmp_path / "first.err", tmp_path / "second.err"
    first = _start(project, first_err)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_until(
            lambda: any("-e" in line.split() for line in _log(project)),
            30,
            "the first bootstrap's editable install to start",
        )
        second = _start(project, second_err)
        # the fixed script: the second says it waits; the old one: it runs pip alongside the first
        wait_until(
            lambda: (
                "waiting" in second_err.read_text(encoding="utf-8")
                or sum(line.startswith("start") for line in _log(project)) > 2
            ),
            30,
            "the second bootstrap to wait or to start its own install",
        )
        (project / "release").touch()
        assert first.wait(30) == 0, first_err.read_text(encoding="utf-8")
        assert second.wait(30) == 0, second_err.read_text(encoding="utf-8")
    finally:
        (project / "release").touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    log = _log(project)
    starts = [line for line in log if line.startswith("start")]
    assert len(starts) == 2, f"one bootstrap installs (pip, then Corral), the other finds it done: {log}"
    running = 0
    for line in log:  # never two pip runs at once
        running += 1 if line.startswith("start") else -1
        assert running <= 1, f"two pip installs overlapped: {log}"
    waited = second_err.read_text(encoding="utf-8")
    assert "another bootstrap is setting up .venv" in waited and "waiting" in waited, waited
    said = first_err.read_text(encoding="utf-8")
    assert "bootstrap:   [1] orjson>=3" in said, f"a progress line per package collected: {said}"
    assert "bootstrap: .venv is ready" in said, said
