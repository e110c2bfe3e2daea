"""`corral up` as a user runs it: one command, a URL printed, the OpenAI SDK working against it, and a
Ctrl-C that leaves no process behind — even when an engine will not exit on SIGTERM."""

from __future__ import annotations

import re
import signal
import threading
import time

import httpx
import psutil
import pytest
from openai import OpenAI

from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until


def start_up(*extra: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(["up", "--port", str(port), *extra])
    wait_until(lambda: "router: " in proc.output() or proc.proc.poll() is not None, 90, "the router URL")
    match = re.search(r"router: (http://\S+)", proc.output())
    assert match, proc.output()
    return proc, match.group(1)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_up_prints_a_url_that_serves_the_openai_sdk() -> None:
    proc, url = start_up("--engines", "2")
    try:
        assert url.endswith(str(proc.args[2]))
        assert "curl -s" in proc.output()
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        models = [m.id for m in client.models.list()]
        assert models == ["sim-model"]
        reply = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello"}], max_tokens=5, temperature=0
        )
        assert reply.choices[0].message.content
        assert reply.choices[0].finish_reason in {"length", "stop"}
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        chunks = list(
            client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        assert chunks[-1].usage is not None
        fleet = httpx.get(url + "/v1/fleet").json()
        assert sum(1 for e in fleet["endpoints"] if e["routable"]) == 2
    finally:
        children = descendants(proc.pid)
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(30) == 0, proc.output()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_kills_an_engine_that_will_not_exit() -> None:
    # the engine hangs every request; with shutdown-timeout 0 and a request in flight it never exits
    # on SIGTERM (like the real vLLM capture), so `up` must escalate to SIGKILL after its grace
    proc, url = start_up("--engines", "1", "--stop-grace", "2", "--sim-arg=--hang-after=0")
    children = descendants(proc.pid)
    assert len(children) >= 2

    def hold_a_request() -> None:
        try:
            httpx.post(
                url + "/v1/completions",
                json={"model": "sim-model", "prompt": "x", "max_tokens": 4},
                timeout=20,
            )
        except httpx.HTTPError:
            pass

    holder = threading.Thread(target=hold_a_request, daemon=True)
    holder.start()
    wait_until(
        lambda: any(e["in_flight"] == 1 for e in httpx.get(url + "/v1/fleet").json()["endpoints"]),
        10,
        "the held request to be in flight",
    )
    started = time.monotonic()
    proc.signal(signal.SIGINT)
    assert proc.wait_exit(30) == 0, proc.output()
    assert time.monotonic() - started < 30
    survivors = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, [c.cmdline() for c in survivors]


def test_up_reports_a_failed_start_and_cleans_up() -> None:
    proc = CorralProcess(["up", "--port", str(free_port()), "--sim-arg=--requires=file:/nonexistent/kv.sock"])
    code = proc.wait_exit(60)
    out = proc.output()
    assert code == 1, out
    assert re.search(r"engine-\d exited with code 1", out), out
    assert "/nonexistent/kv.sock" in out


@pytest.mark.parametrize("bad", [["--engines", "0"], ["--policy", "nope"]])
def test_up_rejects_bad_options(bad: list[str]) -> None:
    proc = CorralProcess(["up", *bad])
    assert proc.wait_exit(30) == 2
    assert "Invalid value" in proc.output()
