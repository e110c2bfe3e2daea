"""`corral verify` through a router that has tenants (`corral router --api-keys-file`) in front of a
real `corral sim`: without a tenant key the smoke requests get 401 and the smoke check says which flag
to pass; with `--router-api-key-file` (or CORRAL_ROUTER_API_KEY_FILE) verify passes; a wrong key is
named as refused. The checks rollout's POSTCHECK runs carry the key the same way. No key is printed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.clients.access import FleetAccess
from corral.fleet.checks.probe import FleetTarget, look
from corral.fleet.checks.verify import FAIL, PASS, Expectations, run_checks
from tests.support.procs import CorralProcess, free_port, start_sim

TENANT_KEY = "tenant-key-for-verify-4e7a91c2d0"
WRONG_KEY = "not-a-tenant-key-b3f08d"


def corral(*args: str, state_home: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run one `corral` command to its end; (exit code, output)."""
    env = {"XDG_STATE_HOME": str(state_home), "COLUMNS": "250", "VLLM_API_KEY": "", **(env or {})}
    proc = CorralProcess(list(args), env=env)
    try:
        return proc.wait_exit(60), proc.output()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def tenant_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A sim behind a loopback router that serves tenants only: (router URL, a file with a tenant key)."""
    tmp = tmp_path_factory.mktemp("tenant-router")
    keys, tenant_key = tmp / "keys.yaml", tmp / "tenant.key"
    keys.write_text(f"- name: ops\n  key: {TENANT_KEY}\n")
    keys.chmod(0o600)
    tenant_key.write_text(TENANT_KEY + "\n")
    sim, sim_url = start_sim(None, "--ttft-base-ms", "5", "--itl-ms", "2")
    port = free_port()
    router = CorralProcess(
        [
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--models-refresh-seconds",
            "0.5",
            "--backend",
            sim_url,
            "--api-keys-file",
            str(keys),
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        router.wait_http(url + "/health")
        yield url, tenant_key
    finally:
        router.stop()
        sim.stop()


def assert_clear(out: str, *wanted: str) -> None:
    assert "Traceback" not in out, out
    for text in wanted:
        assert text in out, out
    assert TENANT_KEY not in out and WRONG_KEY not in out, out


def test_verify_without_a_tenant_key_fails_smoke_naming_the_flag(
    tenant_router: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = tenant_router
    code, out = corral("verify", "--router", url, state_home=tmp_path)
    assert code == 1, out
    assert_clear(out, "the router wants a tenant key; pass --router-api-key-file")
    assert out.split("FAILED:")[1].split() == ["smoke"], out


def test_verify_passes_with_the_tenant_key_from_the_flag_or_the_env(
    tenant_router: tuple[str, Path], tmp_path: Path
) -> None:
    url, key_file = tenant_router
    code, out = corral("verify", "--router", url, "--router-api-key-file", str(key_file), state_home=tmp_path)
    assert code == 0, out
    assert_clear(out, f"via {url}")

    env = {"CORRAL_ROUTER_API_KEY_FILE": str(key_file)}
    code, out = corral("verify", "--router", url, state_home=tmp_path, env=env)
    assert code == 0, out
    assert_clear(out, f"via {url}")


def test_verify_with_a_key_the_router_refuses_says_so(
    tenant_router: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = tenant_router
    wrong = tmp_path / "wrong.key"
    wrong.write_text(WRONG_KEY + "\n")
    code, out = corral("verify", "--router", url, "--router-api-key-file", str(wrong), state_home=tmp_path)
    assert code == 1, out
    assert_clear(out, "refused the key in --router-api-key-file", "--api-keys-file")


async def test_the_postcheck_checks_carry_the_tenant_key_to_the_router(
    tenant_router: tuple[str, Path],
) -> None:
    """What rollout's and rollback's POSTCHECK runs: `run_checks` on a look at the fleet."""
    url, _ = tenant_router
    for access, verdict in ((FleetAccess(), FAIL), (FleetAccess(router_key=TENANT_KEY), PASS)):
        target = FleetTarget(url, [], None, access)
        checks, _ = await run_checks(await look(target), Expectations(), None)
        smoke = next(c for c in checks if c.name == "smoke")
        assert smoke.verdict == verdict, smoke
        assert TENANT_KEY not in smoke.detail
