"""The runbook step of an operation in flight, on the supervisor's state stream: a sleep on a
supervised `corral sim` sends one `operation` line per step, in the runbook's order, then one saying
it ended; state lines carry the operation too, and `/v1/state` shows none once it is over."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.test_supervisor_sleep_ops import (
    DEV,
    SIM_ARGS,
    STEPS,
    SUP_ARGS,
    TOKEN,
    finish,
    wait_state,
)
from tests.integration.test_supervisor_support import http_json, supervised


def follow(url: str, out: list[dict[str, Any]], opened: threading.Event) -> None:
    """Every line of the watch stream until an operation has begun and ended."""
    req = urllib.request.Request(url + "/v1/state/watch", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        began = False
        for raw in resp:
            line = json.loads(raw)
            out.append(line)
            opened.set()
            if line["type"] == "operation":
                if line["operation"] is None and began:
                    return
                began = True


def test_a_sleep_sends_each_runbook_step_once_in_order(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with supervised(sim_args=SIM_ARGS, sup_args=(*SUP_ARGS, str(token_file)), env=DEV) as sup:
        wait_state(sup, "READY")
        assert http_json(sup.url + "/v1/state", token=TOKEN)[1]["operation"] is None
        lines: list[dict[str, Any]] = []
        opened = threading.Event()
        watcher = threading.Thread(target=follow, args=(sup.url, lines, opened), daemon=True)
        watcher.start()
        assert opened.wait(30), "the watch stream sent no first line"
        status, op = http_json(
            sup.url + "/v1/sleep", "POST", {"level": 1, "operation_id": "nap"}, token=TOKEN
        )
        assert status == 202, op
        assert finish(sup, op)["status"] == "succeeded"
        watcher.join(30)
        assert not watcher.is_alive(), lines

        steps = [line["operation"] for line in lines if line["type"] == "operation"]
        assert [s["step"] if s else None for s in steps] == [*STEPS, None]  # one line per step, no more
        assert all(s["kind"] == "sleep" and s["detail"] == "level 1" for s in steps if s)
        assert steps[0]["id"] is None and all(s["id"] == "nap" for s in steps[1:] if s)  # id once accepted
        since = [s["since"] for s in steps if s]
        assert since == sorted(since)
        # a state line queued during the operation carries it (a router reconnecting mid-way learns it)
        draining = [line for line in lines if line["type"] == "state" and line["state"] == "DRAINING"]
        assert draining and all(line["operation"]["kind"] == "sleep" for line in draining)
        status, body = http_json(sup.url + "/v1/state", token=TOKEN)
        assert status == 200 and body["state"] == "SLEEPING" and body["operation"] is None
