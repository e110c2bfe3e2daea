"""The live dashboard in a real headless Chromium, on a real `corral up` fleet: every engine READY,
then engine-0 SLEEPING after `corral sleep`, READY after `corral wake`, and during `corral rollout` a
new serving group appearing and the old one leaving. Screenshots of each stage are kept."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_rollout import stop_up
from tests.integration.test_up import start_up
from tests.support.procs import CorralProcess

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
    proc, url = start_up("--engines", "2", "--group-size", "2", state_home=state)
    try:
        yield proc, url, state
    finally:
        stop_up(proc)


def _corral(state: Path, *args: str) -> str:
    proc = CorralProcess(list(args), env={"XDG_STATE_HOME": str(state)})
    code = proc.wait_exit(120)
    assert code == 0, proc.output()[-3000:]
    return proc.output()


def test_the_dashboard_follows_sleep_wake_and_a_rollout(
    fleet: tuple[CorralProcess, str, Path], artifacts: Path, tmp_path: Path
) -> None:
    _browser_or_skip()
    from playwright.sync_api import sync_playwright

    proc, url, state = fleet
    port = url.rsplit(":", 1)[1]
    assert f"dashboard: {url}/dashboard" in proc.output()
    up_file = json.loads((state / "corral" / f"up-{port}.json").read_text())
    row = {e["name"]: f'tr[data-url="{e["engine"]}"]' for e in up_file["engines"]}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 800})
            page.goto(url + "/dashboard")
            page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
            for engine in ("engine-0", "engine-1"):
                page.wait_for_selector(row[engine] + '[data-state="READY"]', timeout=WAIT_MS)
            old_groups = set(
                page.eval_on_selector_all("li[data-group]", "els => els.map(e => e.dataset.group)")
            )
            assert old_groups, page.content()
            page.screenshot(path=str(artifacts / "1-ready.png"), full_page=True)

            _corral(state, "sleep", "--port", port, "--engine", "engine-0", "--level", "1")
            page.wait_for_selector(row["engine-0"] + '[data-state="SLEEPING"]', timeout=WAIT_MS)
            assert "SLEEPING" in page.inner_text(row["engine-0"])  # text, not color alone
            page.screenshot(path=str(artifacts / "2-sleeping.png"), full_page=True)

            _corral(state, "wake", "--port", port, "--engine", "engine-0")
            page.wait_for_selector(row["engine-0"] + '[data-state="READY"]', timeout=WAIT_MS)
            page.screenshot(path=str(artifacts / "3-awake.png"), full_page=True)

            bundle = tmp_path / "v2.yaml"
            bundle.write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\n')
            rollout = CorralProcess(
                ["rollout", "--port", port, "--to", str(bundle)], env={"XDG_STATE_HOME": str(state)}
            )
            seen_new = page.wait_for_function(
                "old => [...document.querySelectorAll('li[data-group]')]"
                ".some(e => !old.includes(e.dataset.group))",
                arg=sorted(old_groups),
                timeout=90_000,
            )
            assert seen_new
            page.screenshot(path=str(artifacts / "4-rollout.png"), full_page=True)
            assert rollout.wait_exit(120) == 0, rollout.output()[-3000:]
            page.wait_for_function(
                "old => ![...document.querySelectorAll('li[data-group]')]"
                ".some(e => old.includes(e.dataset.group))",
                arg=sorted(old_groups),
                timeout=WAIT_MS,
            )
            page.screenshot(path=str(artifacts / "5-rolled-out.png"), full_page=True)
        finally:
            browser.close()
