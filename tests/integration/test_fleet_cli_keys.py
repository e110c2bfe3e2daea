"""Corral's own CLIs against a locked-down fleet: `status`, `verify` and `doctor` read a router bound
to 0.0.0.0 (which wants its admin key even from 127.0.0.1) only with `--router-admin-key-file`, find
its admin routes on `--admin-port` through `--router-admin-url`, and reach an engine enforcing vLLM's
`--api-key` only with `--engine-api-key-file` (or VLLM_API_KEY); without them each says what to pass,
and no key is ever printed. `rollout` reads the wide router's /v1/fleet the same way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_supervisor_support import kill_leftovers, start_supervised
from tests.support.procs import CorralProcess, free_port, start_sim

ADMIN_KEY = "router-admin-key-5f1c0e9a7b"
ENGINE_KEY = "engine-key-3d8b2a6c4e"


def corral(*args: str, state_home: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run one `corral` command to its end; (exit code, output)."""
    env = {"XDG_STATE_HOME": str(state_home), "COLUMNS": "250", **(env or {})}
    proc = CorralProcess(list(args), env={"VLLM_API_KEY": "", **env})
    try:
        return proc.wait_exit(180), proc.output()
    finally:
        proc.stop()


def start_router(*args: str, host: str = "127.0.0.1") -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        ["router", "--host", host, "--port", str(port), "--models-refresh-seconds", "0.5", *args]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")  # 200 once the engine is READY behind it
    return proc, url


def assert_clear(out: str, *wanted: str) -> None:
    assert "Traceback" not in out, out
    for text in wanted:
        assert text in out, out
    assert ADMIN_KEY not in out and ENGINE_KEY not in out, out


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    admin, engine = tmp_path / "admin.key", tmp_path / "engine.key"
    admin.write_text(ADMIN_KEY + "\n")
    engine.write_text(ENGINE_KEY + "\n")
    return admin, engine


@pytest.fixture
def wide_router(keys: tuple[Path, Path]) -> Iterator[str]:
    """A sim behind a router listening on 0.0.0.0 with an admin key (reached here on 127.0.0.1)."""
    sim, sim_url = start_sim()
    try:
        router, url = start_router("--backend", sim_url, "--admin-key-file", str(keys[0]), host="0.0.0.0")
    except BaseException:
        sim.stop()
        raise
    try:
        yield url
    finally:
        router.stop()
        sim.stop()


def test_status_reads_a_wide_router_only_with_its_admin_key(
    wide_router: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    code, out = corral("status", "--router", wide_router, state_home=tmp_path)
    assert code != 0, out
    assert_clear(out, "--router-admin-key-file")

    code, out = corral(
        "status", "--router", wide_router, "--router-admin-key-file", str(keys[0]), state_home=tmp_path
    )
    assert code == 0, out
    assert_clear(out, "READY, routable")

    env = {"CORRAL_ROUTER_ADMIN_KEY_FILE": str(keys[0])}
    code, out = corral("status", "--router", wide_router, state_home=tmp_path, env=env)
    assert code == 0, out
    assert_clear(out, "READY, routable")

    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-admin-key\n")
    code, out = corral(
        "status", "--router", wide_router, "--router-admin-key-file", str(wrong), state_home=tmp_path
    )
    assert code != 0, out
    assert_clear(out, "refused the key", "--admin-key-file")
    assert "not-the-admin-key" not in out


def test_verify_and_doctor_say_which_key_a_wide_router_wants(
    wide_router: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    code, out = corral("verify", "--router", wide_router, state_home=tmp_path)
    assert code == 1, out
    assert_clear(out, "--router-admin-key-file")
    assert "membership" in out.split("FAILED:")[1], out
    code, out = corral(
        "verify", "--router", wide_router, "--router-admin-key-file", str(keys[0]), state_home=tmp_path
    )
    assert code == 0, out
    assert_clear(out)

    code, out = corral("doctor", "--router", wide_router, state_home=tmp_path)
    assert code == 1, out
    assert_clear(out, "--router-admin-key-file")
    assert "restart the router" not in out, out  # it is up; it wants a key
    code, out = corral(
        "doctor", "--router", wide_router, "--router-admin-key-file", str(keys[0]), state_home=tmp_path
    )
    assert code == 0, out
    assert_clear(out, "healthy")


def test_status_finds_the_admin_routes_on_the_routers_admin_port(tmp_path: Path) -> None:
    sim, sim_url = start_sim()
    admin_port = free_port()
    try:
        router, url = start_router("--backend", sim_url, "--admin-port", str(admin_port))
        try:
            code, out = corral("status", "--router", url, state_home=tmp_path)
            assert code != 0, out
            assert_clear(out, "--router-admin-url", str(admin_port))
            admin_url = f"http://127.0.0.1:{admin_port}"
            code, out = corral(
                "status", "--router", url, "--router-admin-url", admin_url, state_home=tmp_path
            )
            assert code == 0, out
            assert_clear(out, "READY, routable")
        finally:
            router.stop()
    finally:
        sim.stop()


@pytest.fixture
def keyed_engine(keys: tuple[Path, Path]) -> Iterator[str]:
    """A sim enforcing ENGINE_KEY behind a loopback router that sends it (`--engine-api-key-file`)."""
    sim, sim_url = start_sim(None, "--api-key", ENGINE_KEY)
    try:
        router, url = start_router("--backend", sim_url, "--engine-api-key-file", str(keys[1]))
    except BaseException:
        sim.stop()
        raise
    try:
        yield url
    finally:
        router.stop()
        sim.stop()


def test_verify_reaches_a_keyed_engine_only_with_its_key(
    keyed_engine: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    code, out = corral("verify", "--router", keyed_engine, state_home=tmp_path)
    assert code == 1, out
    assert_clear(out, "--engine-api-key-file")

    code, out = corral(
        "verify", "--router", keyed_engine, "--engine-api-key-file", str(keys[1]), state_home=tmp_path
    )
    assert code == 0, out
    assert_clear(out)

    code, out = corral(
        "verify", "--router", keyed_engine, state_home=tmp_path, env={"VLLM_API_KEY": ENGINE_KEY}
    )
    assert code == 0, out
    assert_clear(out)


def test_doctor_reaches_a_keyed_engine_only_with_its_key(
    keyed_engine: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    code, out = corral("doctor", "--router", keyed_engine, state_home=tmp_path)
    assert code == 1, out
    assert_clear(out, "--engine-api-key-file")

    code, out = corral(
        "doctor", "--router", keyed_engine, "--engine-api-key-file", str(keys[1]), state_home=tmp_path
    )
    assert code == 0, out
    assert_clear(out, "healthy")


def test_rollout_reads_a_wide_routers_fleet_only_with_its_admin_key(
    keys: tuple[Path, Path], tmp_path: Path
) -> None:
    """A host rollout's PRECHECK and ROUTED read the router's /v1/fleet: without the key it stops at
    PRECHECK saying what to pass, before any engine moves; with it the host is switched and routed."""
    bundle = tmp_path / "v2.yaml"
    bundle.write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\n')
    sup = start_supervised(
        sim_args=("--itl-ms", "5"),
        sup_args=(
            "--propagation-timeout",
            "5",
            "--quiet-period",
            "0.3",
            "--bundle-name",
            "v1",
            "--bundle",
            str(bundle),
        ),
    )
    try:
        sup.wait_state("READY", 60)
        router, url = start_router(
            "--supervised",
            f"{sup.engine_url}={sup.url}",
            "--supervisor-heartbeat",
            "0.5",
            "--admin-key-file",
            str(keys[0]),
            host="0.0.0.0",
        )
        try:
            fleet = tmp_path / "hosts.yaml"
            fleet.write_text(f"router: {url}\nsupervisors:\n  - {sup.url}\n")
            pid = sup.state()["engine"]["pid"]
            code, out = corral("rollout", "--fleet", str(fleet), "--to", str(bundle), state_home=tmp_path)
            assert code == 1, out
            assert_clear(out, "PRECHECK", "--router-admin-key-file")
            assert sup.state()["bundle_name"] == "v1" and sup.state()["engine"]["pid"] == pid

            code, out = corral(
                "rollout",
                "--fleet",
                str(fleet),
                "--to",
                str(bundle),
                "--router-admin-key-file",
                str(keys[0]),
                state_home=tmp_path,
            )
            assert code == 0, out
            assert_clear(out, "ROUTED")
            assert sup.state()["bundle_name"] == "v2"
        finally:
            router.stop()
    finally:
        pids = sup.engine_pids()
        sup.proc.stop(grace=20)
        kill_leftovers(pids)
