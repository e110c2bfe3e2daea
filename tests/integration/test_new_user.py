"""What a stranger types on a fresh clone, without editing anything: `scripts/up --port P` (the real
script with the repo's .venv), a chat request to the router URL it prints, then `corral status`, `sleep`,
`wake` and `doctor` from another shell with `.venv/bin` on PATH as the README says, the tour's rollout and
rollback with `corral load` running in a third shell (no request fails), and Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

import httpx
import orjson

from tests.support.procs import free_port
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"


def user_env(state_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        "XDG_STATE_HOME": str(state_home),
        "COLUMNS": "200",
    }


def typed(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """One command as typed in a second shell: `corral` found on PATH."""
    done = subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    return done.returncode, done.stdout + done.stderr


def status(port: str, env: dict[str, str]) -> tuple[int, dict]:
    code, out = typed("corral", "status", "--port", port, "--json", env=env)
    return code, orjson.loads(out)


def read(log: Path) -> str:
    return log.read_text(errors="replace")


def test_a_new_user_starts_the_default_fleet_and_runs_the_runbook(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    port = str(free_port())
    log = Path(tempfile.mkstemp(prefix="corral-new-user-", suffix=".log")[1])
    with log.open("wb") as out:
        up = subprocess.Popen(
            [str(ROOT / "scripts" / "up"), "--port", port],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, as a terminal gives it: Ctrl-C reaches all
        )
    try:
        wait_until(lambda: "router: " in read(log) or up.poll() is not None, 90, "the router URL")
        match = re.search(r"router: (http://\S+)", read(log))
        assert match, read(log)
        url = match.group(1)

        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5},
            timeout=30,
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text

        code, body = status(port, env)
        assert code == 0 and body["engines"], body
        assert {e["state"] for e in body["engines"]} == {"READY"}, body

        code, out = typed("corral", "sleep", "--port", port, "--engine", "engine-0", env=env)
        assert code == 0 and "succeeded" in out, out
        code, body = status(port, env)
        asleep = next(e for e in body["engines"] if e["name"] == "engine-0")
        assert code == 0 and asleep["state"] == "SLEEPING", body  # a planned sleep is settled

        code, out = typed("corral", "wake", "--port", port, "--engine", "engine-0", env=env)
        assert code == 0 and "succeeded" in out, out
        code, body = status(port, env)
        assert code == 0 and {e["state"] for e in body["engines"]} == {"READY"}, body

        code, out = typed("corral", "doctor", "--port", port, "--json", env=env)
        assert code == 0, out
        orjson.loads(out)

        # the tour's section 5: a bundle written as the README writes it, rolled out and back while
        # `corral load` runs in a third shell; the load's own summary and the rollout's say none failed
        bundle = tmp_path / "v2.yaml"
        bundle.write_text('name: v2\nengine_args: ["--itl-ms", "5", "--version-string", "0.33.1"]\n')
        load_log = tmp_path / "load.log"
        with load_log.open("wb") as load_out:
            load = subprocess.Popen(
                ["corral", "load", "--port", port, "--rate", "20", "--seconds", "120"],
                env=env,
                stdout=load_out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            first_line = lambda: " ok " in read(load_log) or load.poll() is not None  # noqa: E731
            wait_until(first_line, 30, "the load's first line")
            code, out = typed("corral", "rollout", "--port", port, "--to", str(bundle), env=env)
            assert code == 0 and "succeeded" in out, out  # the command's printed answer is the contract
            during = r"requests during the rollout: [1-9]\d* answered by the router, 0 failed"
            assert re.search(during, out), out
            code, out = typed("corral", "rollback", "--port", port, env=env)
            assert code == 0 and "succeeded" in out, out  # the command's printed answer is the contract
        finally:
            if load.poll() is None:
                os.killpg(load.pid, signal.SIGINT)  # Ctrl-C in the load's shell
            load.wait(timeout=30)
        # the load's summary line is the contract: what it sent and that none failed
        summary = read(load_log)
        assert load.returncode == 0, summary
        assert re.search(r"load stopped by Ctrl-C: sent [1-9]\d* .*failed 0", summary), summary

        os.killpg(up.pid, signal.SIGINT)
        assert up.wait(timeout=60) == 0, read(log)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(timeout=10)
