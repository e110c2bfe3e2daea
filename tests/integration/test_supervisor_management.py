"""The management API and the preStop hook: bearer token on /v1 (probes stay open), the state watch
stream (current state first, epochs increasing), `corral supervise prestop` draining and blocking
until done, and operations idempotent under their operation id."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.test_supervisor_support import gone, http_json, supervised

TOKEN = "s3cret-token"


def watch_lines(url: str, token: str, out: list[dict[str, Any]], until_sub_state: str) -> None:
    req = urllib.request.Request(url + "/v1/state/watch", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        for raw in resp:
            event = json.loads(raw)
            out.append(event)
            if event.get("sub_state") == until_sub_state:
                return


def test_token_watch_prestop_and_idempotent_operations(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with supervised(sup_args=("--token-file", str(token_file), "--quiet-period", "0.3")) as sup:
        # probes need no token; management does
        sup.proc.wait_http(sup.url + "/readyz", timeout=30)
        assert http_json(sup.url + "/v1/state")[0] == 401
        assert http_json(sup.url + "/v1/state", token="wrong")[0] == 401
        status, state = http_json(sup.url + "/v1/state", token=TOKEN)
        assert status == 200 and state["state"] == "READY"
        engine_pid = state["engine"]["pid"]

        events: list[dict[str, Any]] = []
        watcher = threading.Thread(target=watch_lines, args=(sup.url, TOKEN, events, "engine_stopped"))
        watcher.start()

        prestop = subprocess.run(
            [
                sys.executable,
                "-m",
                "corral",
                "supervise",
                "prestop",
                "--url",
                sup.url,
                "--token-file",
                str(token_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert prestop.returncode == 0, prestop.stdout + prestop.stderr
        # the printed answer is the contract: what the person who ran the command reads
        assert "drain finished" in prestop.stdout
        watcher.join(timeout=30)

        # when prestop returns, the engine is already gone and readiness long false
        assert gone(engine_pid)
        code, readyz = sup.probe("/readyz")
        assert code == 503 and (readyz["state"], readyz["sub_state"]) == ("STOPPING", "engine_stopped")
        assert events[0]["state"] == "READY" and events[0]["epoch"] == state["epoch"]
        assert "since" in events[0]
        epochs = [e["epoch"] for e in events if e["type"] == "state"]
        assert epochs == sorted(set(epochs))
        assert [e["state"] for e in events[1:3]] == ["DRAINING", "DRAINING"]
        assert events[-1]["sub_state"] == "engine_stopped"

        # same operation id → the same operation; another kind under that id → 409
        code, first = http_json(sup.url + "/v1/drain", "POST", {"operation_id": "op-1"}, token=TOKEN)
        assert code == 202
        code, again = http_json(sup.url + "/v1/drain", "POST", {"operation_id": "op-1"}, token=TOKEN)
        assert code == 200 and again["started"] == first["started"]
        code, _ = http_json(sup.url + "/v1/shutdown", "POST", {"operation_id": "op-1"}, token=TOKEN)
        assert code == 409
        code, op = http_json(sup.url + "/v1/operations/op-1", token=TOKEN)
        assert code == 200 and op["kind"] == "drain"
        assert http_json(sup.url + "/v1/drain", "POST", {"policy": "later"}, token=TOKEN)[0] == 400

        code, _ = http_json(sup.url + "/v1/shutdown", "POST", {"operation_id": "bye"}, token=TOKEN)
        assert code == 202
        assert sup.proc.wait_exit(timeout=30) == 0
        ops = [r for r in sup.oplog() if r["record"] == "operation"]
        assert {o["operation_id"] for o in ops} >= {"op-1", "bye"}


def test_prestop_when_the_supervisor_is_gone_is_not_an_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "corral", "supervise", "prestop", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    # the printed answer is the contract: what the person who ran the command reads
    assert result.returncode == 0 and "nothing to drain" in result.stdout
