"""The live dashboard in a real headless Chromium, on a real `corral up` fleet of LoRA-enabled
simulators: every engine READY; an adapter loaded with `corral lora load` shown on its engine; a
`corral sleep` whose drain waits on a stream held open shown at its runbook step (DRAIN), then
engine-0 SLEEPING, READY after `corral wake`; requests through the router counted in the models'
one-minute window; and during `corral rollout` under `corral load` the rollout banner naming both
bundles, the charts drawn with points, the model's request count never going backwards as the old
engines are retired, and their exit told in words. The page asks nothing of any origin but the
router's and logs no console error. Screenshots of each stage are kept."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.test_rollout import stop_up
from tests.support.procs import CorralProcess, free_port
from tests.support.waits import wait_until

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000
# LoRA with runtime loads, as vLLM takes them; 20 ms a token, so a 300-token stream holds a drain ~6 s
ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
ENGINE_ARGS = ["--enable-lora", "--max-loras", "2", "--itl-ms", "20"]
ADAPTER = "adapter-dash"


def _browser_or_skip() -> None:
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (apt-get install -y --no-install-recommends chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if missing:
        if os.environ.get("CORRAL_REQUIRE_BROWSER"):
            pytest.fail(f"CORRAL_REQUIRE_BROWSER is set but this machine lacks {', '.join(missing)}")
        pytest.skip(f"no browser for the dashboard test: missing {', '.join(missing)}")


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    where = os.environ.get("CORRAL_TEST_ARTIFACTS")
    out = Path(where) / "dashboard" if where else tmp_path / "artifacts"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[CorralProcess, str, Path]]:
    state = tmp_path / "state"
    port = free_port()
    sim = [f"--sim-arg={arg}" for arg in ENGINE_ARGS]
    # --policy load: the router scrapes the engines' /metrics, so the charts have KV usage and queue;
    # --flow-control: /v1/fleet has the router's own queue, which the page shows
    up = ["up", "--port", str(port), "--engines", "2", "--group-size", "2", "--policy", "load"]
    proc = CorralProcess(
        [*up, "--router-arg=--flow-control", *sim],
        env={"XDG_STATE_HOME": str(state), **ENV},
    )
    wait_until(lambda: "router: " in proc.output() or proc.proc.poll() is not None, 90, "the router URL")
    match = re.search(r"router: (http://\S+)", proc.output())
    # the printed line is the contract: it tells the person where to connect
    assert match, proc.output()
    url = match.group(1)
    try:
        yield proc, url, state
    finally:
        stop_up(proc)


def _corral(state: Path, *args: str) -> str:
    proc = CorralProcess(list(args), env={"XDG_STATE_HOME": str(state)})
    code = proc.wait_exit(120)
    assert code == 0, proc.output()[-3000:]
    return proc.output()


def hold_stream(engine: str, first_chunk: threading.Event, release: threading.Event) -> None:
    """A long completion streamed straight from the engine (450 tokens, 9 s: under the drain's 10 s),
    read until `release` (then the connection is closed) or its end: a sleep's drain (mode wait)
    waits for it."""
    where = urlsplit(engine)
    conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=60)
    body = {"model": "sim-model", "prompt": "hold the drain", "max_tokens": 450, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    while not release.is_set() and resp.readline():
        first_chunk.set()
    conn.close()


def complete(router: str) -> None:
    body = json.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 3}).encode()
    req = urllib.request.Request(router + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


# every named chart has a canvas and at least two points drawn (uPlot draws on a canvas)
CHARTS_DRAWN = """ids => ids.every(id => {
  const c = document.querySelector(`[data-chart="${id}"]`);
  return c && c.querySelector("canvas") && Number(c.dataset.points) >= 2;
})"""
BADGES_COLORED = """() => [...document.querySelectorAll('.badge')]
  .every(b => getComputedStyle(b).backgroundColor !== 'rgba(0, 0, 0, 0)')"""
# the model's request count since the router started, as the page shows it, read every 100 ms
RECORD_TOTALS = """() => {
  window.corralTotals = [];
  window.corralNotRoutable = [];  // each engine's "not routable" cell seen: [its words, the raw reason]
  setInterval(() => {
    const tr = document.querySelector('#models tr[data-model="sim-model"]');
    if (tr) window.corralTotals.push(Number(tr.dataset.total));
    for (const c of document.querySelectorAll("#engines td span.no")) {
      window.corralNotRoutable.push([c.textContent, c.title]);
    }
  }, 100);
}"""


def watch_page(page: Any, router: str) -> list[str]:
    """Console errors, uncaught exceptions and any request to another origin than the router's (the
    page must work offline): each refused and listed."""
    problems: list[str] = []
    origin = router.rstrip("/")
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

    def route(r: Any) -> None:
        if r.request.url.startswith(origin + "/"):
            r.continue_()
        else:
            problems.append(f"asked another origin: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    return problems


def test_the_dashboard_follows_an_adapter_a_sleep_step_by_step_a_wake_and_a_rollout(
    fleet: tuple[CorralProcess, str, Path], artifacts: Path, tmp_path: Path
) -> None:
    _browser_or_skip()
    from playwright.sync_api import sync_playwright

    proc, url, state = fleet
    port = url.rsplit(":", 1)[1]
    # the printed line is the contract: it tells the person where to connect
    assert f"dashboard: {url}/dashboard" in proc.output()
    up_file = json.loads((state / "corral" / f"up-{port}.json").read_text())
    row = {e["name"]: f'tr[data-url="{e["engine"]}"]' for e in up_file["engines"]}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 800})
            problems = watch_page(page, url)
            page.goto(url + "/dashboard")
            page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
            for engine in ("engine-0", "engine-1"):
                page.wait_for_selector(row[engine] + '[data-state="READY"]', timeout=WAIT_MS)
            old_groups = set(
                page.eval_on_selector_all("li[data-group]", "els => els.map(e => e.dataset.group)")
            )
            assert old_groups, page.content()
            page.screenshot(path=str(artifacts / "1-ready.png"), full_page=True)

            # an adapter loaded at run time is listed on its engine (the router learns it from /v1/models)
            adapter_dir = tmp_path / ADAPTER
            adapter_dir.mkdir()
            _corral(state, "lora", "load", "--port", port, "--engine", "engine-0", ADAPTER, str(adapter_dir))
            page.wait_for_selector(f'{row["engine-0"]} [data-adapters~="{ADAPTER}"]', timeout=WAIT_MS)
            assert ADAPTER not in page.inner_text(row["engine-1"])
            page.screenshot(path=str(artifacts / "2-adapter.png"), full_page=True)

            # a sleep whose drain waits for a stream held open: the page shows the runbook step
            first_chunk, release = threading.Event(), threading.Event()
            engine0 = next(e["engine"] for e in up_file["engines"] if e["name"] == "engine-0")
            holder = threading.Thread(target=hold_stream, args=(engine0, first_chunk, release), daemon=True)
            holder.start()
            assert first_chunk.wait(30), "the held stream sent nothing"
            sleep = CorralProcess(
                ["sleep", "--port", port, "--engine", "engine-0", "--level", "1"],
                env={"XDG_STATE_HOME": str(state)},
            )
            step = page.wait_for_selector('#ops li[data-step="drain_policy"]', timeout=WAIT_MS)
            assert step is not None
            shown = step.inner_text()
            assert "engine-0" in shown and "sleep (level 1) · DRAIN" in shown, shown
            assert "DRAIN" in page.inner_text(row["engine-0"])  # on the engine's row as well
            page.screenshot(path=str(artifacts / "3-draining.png"), full_page=True)
            release.set()  # the client goes away: the drain ends and the sleep goes on
            assert sleep.wait_exit(120) == 0, sleep.output()[-3000:]
            holder.join(30)
            page.wait_for_selector(row["engine-0"] + '[data-state="SLEEPING"]', timeout=WAIT_MS)
            assert "SLEEPING" in page.inner_text(row["engine-0"])  # text, not color alone
            page.wait_for_selector('#ops li[data-step="drain_policy"]', state="detached", timeout=WAIT_MS)
            # the steps it went through stay in the recent events, beside the exits from routing
            page.wait_for_selector(
                '#events li[data-engine="engine-0"][data-step="drain_policy"]', timeout=WAIT_MS
            )
            page.screenshot(path=str(artifacts / "4-sleeping.png"), full_page=True)

            _corral(state, "wake", "--port", port, "--engine", "engine-0")
            page.wait_for_selector(row["engine-0"] + '[data-state="READY"]', timeout=WAIT_MS)

            # requests through the router are counted in the models' window, which the page names
            for _ in range(3):
                complete(url)
            page.wait_for_function(
                "() => Number(document.querySelector('#models tr[data-model=\"sim-model\"]')"
                "?.dataset.requests) >= 3",
                timeout=WAIT_MS,
            )
            window = page.inner_text("#window")
            assert re.fullmatch(r"· (last 60 s|since the router started \(\d+ s\))", window), window
            assert ADAPTER in page.inner_text('#models tr[data-model="sim-model"]')  # counted with its base
            page.screenshot(path=str(artifacts / "5-awake.png"), full_page=True)

            # a rollout under load: the charts have points, the banner names both bundles, the model's
            # request count never goes backwards as the old engines are retired
            load = CorralProcess(
                ["load", "--port", port, "--rate", "16", "--seconds", "240"],
                env={"XDG_STATE_HOME": str(state)},
            )
            try:
                page.wait_for_function(
                    CHARTS_DRAWN, arg=["model-rate", "engine-rate", "engine-kv_usage"], timeout=WAIT_MS
                )
                page.evaluate(RECORD_TOTALS)
                queue = page.wait_for_selector("#flow:not([hidden]) #flow-body[data-depth]", timeout=WAIT_MS)
                assert queue is not None and "waiting in the router" in queue.inner_text(), queue
                initial = page.get_attribute(row["engine-0"] + " [data-bundle]", "data-bundle")
                assert initial, page.inner_text(row["engine-0"])  # the bundle's name, not its fingerprint
                bundle = tmp_path / "v2.yaml"
                bundle.write_text(
                    f"name: v2\nengine_args: {json.dumps(['--version-string', '0.33.1', *ENGINE_ARGS])}\n"
                )
                rollout = CorralProcess(
                    ["rollout", "--port", port, "--to", str(bundle)], env={"XDG_STATE_HOME": str(state)}
                )
                banner = page.wait_for_selector('#rollout[data-state="active"]', timeout=90_000)
                assert banner is not None
                assert (banner.get_attribute("data-from"), banner.get_attribute("data-to")) == (initial, "v2")
                page.wait_for_function(
                    "old => [...document.querySelectorAll('li[data-group]')]"
                    ".some(e => !old.includes(e.dataset.group))",
                    arg=sorted(old_groups),
                    timeout=90_000,
                )
                page.screenshot(path=str(artifacts / "6-rollout.png"), full_page=True)
                # every state badge is readable, STOPPING (the old engines now) included
                assert page.evaluate(BADGES_COLORED), page.inner_text("#engines")
                assert rollout.wait_exit(120) == 0, rollout.output()[-3000:]
                page.wait_for_function(
                    "old => ![...document.querySelectorAll('li[data-group]')]"
                    ".some(e => old.includes(e.dataset.group))",
                    arg=sorted(old_groups),
                    timeout=WAIT_MS,
                )
                ended = page.wait_for_selector('#rollout[data-state="ended"]', timeout=WAIT_MS)
                assert ended is not None and ended.get_attribute("data-failed") == "0", ended.inner_text()
                totals = page.evaluate("() => window.corralTotals")
                assert len(totals) > 10 and totals == sorted(totals) and totals[-1] > totals[0], totals
                # an engine leaving is "no — draining…" in the table, the router's reason on hover
                cells = page.evaluate("() => window.corralNotRoutable")
                assert cells and all("supervisor:" not in text and raw for text, raw in cells), cells[:5]
                seen = sorted(set(map(tuple, cells)))
                assert any(text.startswith("no — draining") for text, _ in seen), seen
                # the old engines' exit, in words, with the router's own record kept on hover
                told = page.wait_for_selector('#events li[data-cause="supervisor_draining"]', timeout=WAIT_MS)
                assert told is not None
                text, raw = told.inner_text(), told.get_attribute("title") or ""
                assert re.search(
                    r" engine-\d \(127\.0\.0\.1:\d+\) stopped taking new requests: "
                    r"its supervisor is draining it for a rollout$",
                    text,
                ), (text, raw)
                assert "supervisor_draining" in raw and "supervisor_draining" not in text
                page.wait_for_function(CHARTS_DRAWN, arg=["model-ttft", "engine-waiting"], timeout=WAIT_MS)
                # the new engines drawn beside the old ones, which stay on the charts as they leave
                page.wait_for_function(
                    "() => Number(document.querySelector('[data-chart=\"engine-rate\"]').dataset.lines) >= 4",
                    timeout=WAIT_MS,
                )
                page.screenshot(path=str(artifacts / "7-rolled-out.png"), full_page=True)
            finally:
                load.signal(signal.SIGINT)
                load.wait_exit(60)
            assert not problems, problems
        finally:
            browser.close()
