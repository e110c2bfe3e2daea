"""`corral up --prefill N --decode M`: serving groups of each role, each engine's connector config and
its supervisor's `--role`, the role on the router's backends lines, the fleet file and the control
API; bad counts named. Nothing is started here."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from corral.bundle_spec import BundleSpec
from corral.engine.pd_protocol import parse_kv_transfer_config, role_of
from corral.fleet.local.control import FleetControl
from corral.fleet.local.fleet import FleetSpec, LocalFleet
from corral.fleet.local.roles import RoleCountError, engine_args_for, role_groups
from corral.fleet.local.up import up
from corral.router.discovery.backends_file import parse_backends


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _fleet(tmp_path: Path) -> LocalFleet:
    fleet = LocalFleet(FleetSpec(engines=4, prefill=2, decode=2), tmp_path, tmp_path / "fleet.json")
    for role, count in fleet.spec.role_groups:
        for _ in range(count):
            fleet.engines += fleet._new_group(fleet.spec.initial_bundle, 1, role)
    fleet._write_backends_file()
    fleet._write_fleet_file()
    return fleet


def test_role_groups_and_bad_counts() -> None:
    assert role_groups(4, 0, 0, 2) == [("both", 2)]
    assert role_groups(6, 2, 4, 2) == [("prefill", 1), ("decode", 2)]
    cases = {
        (2, 2, 0, 1): "--prefill without --decode: a disaggregated fleet needs engines of both roles",
        (1, 0, 1, 1): "--decode without --prefill",
        (3, 1, 2, 2): r"--prefill 1 is not a multiple of --group-size 2.*use e.g. --prefill 2",
        (3, 0, 0, 2): r"--engines 3 is not a multiple of --group-size 2",
    }
    for args, message in cases.items():
        with pytest.raises(RoleCountError, match=message):
            role_groups(*args)


def test_each_role_runs_its_bundle_with_the_connector_and_tells_its_supervisor(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    assert [(m.group, m.role) for m in fleet.engines] == [
        ("g0", "prefill"),
        ("g1", "prefill"),
        ("g2", "decode"),
        ("g3", "decode"),
    ]
    prints = set()
    for member in fleet.engines:
        argv = member.process.argv
        supervise, sim = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
        assert _flag(supervise, "--role") == member.role
        config = parse_kv_transfer_config(_flag(sim, "--kv-transfer-config"))
        # kv_both on every engine: one bundle fingerprint for both roles; the role is the supervisor's
        assert role_of(config) == "both" and config["kv_connector"] == "NixlConnector"
        prints.add(_flag(sim, "--kv-transfer-config"))
    assert len(prints) == 1
    backends = parse_backends(fleet.backends_file.read_text(), fleet.backends_file)  # as the router reads it
    assert backends.roles == {m.engine_url: m.role for m in fleet.engines}
    assert backends.supervisors == {m.engine_url: m.url for m in fleet.engines}
    body = orjson.loads(fleet.fleet_file.read_bytes())
    assert [e["role"] for e in body["engines"]] == ["prefill", "prefill", "decode", "decode"]


def test_an_aggregated_fleet_adds_nothing_and_a_bundles_own_connector_is_kept(tmp_path: Path) -> None:
    fleet = LocalFleet(FleetSpec(engines=1), tmp_path, tmp_path / "fleet.json")
    member = fleet._new_group(fleet.spec.initial_bundle, 1)[0]
    assert "--role" not in member.process.argv and "--kv-transfer-config" not in member.process.argv
    fleet.engines.append(member)
    fleet._write_backends_file()
    assert "role=" not in fleet.backends_file.read_text()
    own = ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}']
    assert engine_args_for("decode", own) == own
    assert engine_args_for("both", ["--itl-ms", "5"]) == ["--itl-ms", "5"]


async def test_the_control_api_lists_roles_and_refuses_a_bad_one(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    server = TestServer(FleetControl(fleet, "s3cret").app(), host="127.0.0.1")
    await server.start_server()
    auth = {"Authorization": "Bearer s3cret"}
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{server.port}/v1/groups", headers=auth) as resp:
                groups = (await resp.json())["groups"]
            assert [(g["name"], g["role"]) for g in groups] == [
                ("g0", "prefill"),
                ("g1", "prefill"),
                ("g2", "decode"),
                ("g3", "decode"),
            ]
            assert {m["role"] for m in groups[2]["members"]} == {"decode"}
            body = {"bundle": BundleSpec(name="v2").to_json(), "role": "prefil"}
            async with client.post(
                f"http://127.0.0.1:{server.port}/v1/groups", headers=auth, json=body
            ) as resp:
                assert resp.status == 400
                assert "role 'prefil': one of prefill, decode, both" in await resp.text()
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "2", "--prefill", "1", "--decode", "1"], "use either --engines N"),
        (["--prefill", "2"], "--prefill without --decode"),
        (["--prefill", "1", "--decode", "2", "--group-size", "2"], "--prefill 1 is not a multiple"),
    ],
)
def test_up_refuses_bad_role_counts_before_anything_starts(args: list[str], message: str) -> None:
    result = CliRunner().invoke(up, args)
    assert result.exit_code == 2 and message in result.output, result.output
