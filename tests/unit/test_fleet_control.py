"""The control API of `corral up` and the bundle files it takes: a token always, bad input named."""

from __future__ import annotations

import stat
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from corral.bundle_spec import BundleError, load_bundle
from corral.fleet.local.control import FleetControl, write_token_file
from corral.fleet.local.fleet import FleetSpec, LocalFleet


def test_a_bundle_file_is_read_and_bad_ones_are_named(tmp_path: Path) -> None:
    good = tmp_path / "v2.yaml"
    good.write_text('name: v2\nengine_args: ["--version-string", "0.33.1"]\nenv: {CORRAL_IMAGE: "img:2"}\n')
    bundle = load_bundle(good)
    assert bundle.name == "v2" and bundle.engine_args == ("--version-string", "0.33.1")
    assert bundle.to_json()["env"] == {"CORRAL_IMAGE": "img:2"}
    cases = {
        "name: 'a b'\n": r"name: Value error, 'a b': use letters",
        "name: v\nengine_args: ['--port', '1']\n": r"engine_args: .*the fleet sets --host, --port, --seed",
        "name: v\nengine_args: ['--port=1']\n": r"the fleet sets",
        "name: v\nimage: x\n": r"image: Extra inputs are not permitted",
        "engine_args: []\n": r"name: Field required",
        "- a\n": r"write a mapping",
        "name: [\n": r"not valid YAML",
    }
    for text, message in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(BundleError, match=message):
            load_bundle(path)
    with pytest.raises(BundleError, match=r"cannot read the bundle file .*missing.yaml"):
        load_bundle(tmp_path / "missing.yaml")


def test_the_token_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "up.token"
    token = write_token_file(path)
    assert path.read_text().strip() == token and len(token) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert write_token_file(path) != token  # a new fleet, a new token


async def test_the_control_api_wants_the_token_and_names_bad_input(tmp_path: Path) -> None:
    fleet = LocalFleet(FleetSpec(), tmp_path / "logs", tmp_path / "up.json")
    server = TestServer(FleetControl(fleet, "s3cret").app(), host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    auth = {"Authorization": "Bearer s3cret"}
    try:
        async with aiohttp.ClientSession() as client:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                async with client.get(base + "/v1/groups", headers=headers) as resp:
                    assert resp.status == 401
                    assert "s3cret" not in await resp.text()
            async with client.post(base + "/v1/groups", json={"bundle": {"name": "x"}}) as resp:
                assert resp.status == 401  # nothing is started without the token
            async with client.get(base + "/v1/groups", headers=auth) as resp:
                assert resp.status == 200 and (await resp.json())["groups"] == []
            bad = {
                b"{": "body is not JSON",
                b"{}": 'write {"bundle"',
                b'{"bundle": {"name": "x"}, "size": 0}': "size 0: a whole number",
                b'{"bundle": {"name": "x"}, "size": true}': "size True",
                b'{"bundle": {"name": "x"}, "startup_timeout": -1}': "startup_timeout -1",
                b'{"bundle": {"name": "x", "engine_args": ["--host=0"]}}': "the fleet sets",
            }
            for body, message in bad.items():
                async with client.post(base + "/v1/groups", data=body, headers=auth) as resp:
                    assert resp.status == 400, body
                    assert message in (await resp.json())["error"]["message"]
            async with client.delete(base + "/v1/groups/g9", headers=auth) as resp:
                assert resp.status == 404
                assert "no serving group 'g9'" in (await resp.json())["error"]["message"]
        assert fleet.engines == [] and not (tmp_path / "logs").exists()
    finally:
        await server.close()
