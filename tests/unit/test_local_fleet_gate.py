"""What `corral up` starts for one engine, with and without the admission gate: behind a gate the
engine listens on loopback and the gate's URL is the engine URL the router's backends and the fleet
file carry; `--no-gate` keeps the engine itself as that URL. Nothing is started here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from corral.fleet.local.fleet import FleetSpec, LocalFleet


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _one_engine(tmp_path: Path, **spec: Any) -> tuple[LocalFleet, list[str]]:
    fleet = LocalFleet(FleetSpec(**spec), tmp_path, tmp_path / "fleet.json")
    member = fleet._new_group(fleet.spec.initial_bundle, 1)[0]
    fleet.engines.append(member)
    fleet._write_backends_file()
    fleet._write_fleet_file()
    return fleet, member.process.argv


def test_each_engine_is_reached_through_its_supervisors_gate(tmp_path: Path) -> None:
    fleet, argv = _one_engine(tmp_path, host="0.0.0.0", drain_timeout=1.5)
    supervise, sim = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    gate = f"http://0.0.0.0:{_flag(supervise, '--gate-port')}"
    assert _flag(supervise, "--gate-host") == "0.0.0.0" and _flag(supervise, "--drain-timeout") == "1.5"
    assert _flag(sim, "--host") == "127.0.0.1"  # the engine's dev endpoints stay off the network
    assert _flag(supervise, "--engine-url") == f"http://127.0.0.1:{_flag(sim, '--port')}"
    member = fleet.engines[0]
    assert member.engine_url == gate and member.to_json()["engine"] == gate
    assert fleet.backends_file.read_text().startswith(f"{gate}={member.url}")
    assert orjson.loads(fleet.fleet_file.read_bytes())["engines"][0]["engine"] == gate


def test_without_a_gate_the_engine_itself_is_the_url(tmp_path: Path) -> None:
    fleet, argv = _one_engine(tmp_path, gate=False)
    supervise, sim = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert "--gate-port" not in supervise
    engine = f"http://127.0.0.1:{_flag(sim, '--port')}"
    assert _flag(supervise, "--engine-url") == engine == fleet.engines[0].engine_url
    assert fleet.backends_file.read_text().startswith(f"{engine}=")


def test_the_default_bundle_is_runbook_ready_unless_told_or_loading_from_a_daemon() -> None:
    ready = FleetSpec(sim_args=("--itl-ms=5",)).initial_bundle
    assert ready.engine_args == ("--enable-sleep-mode", "--itl-ms=5")
    assert ready.env == {"VLLM_SERVER_DEV_MODE": "1"}
    plain = FleetSpec(sim_args=("--itl-ms=5",), runbook_ready=False).initial_bundle
    assert plain.engine_args == ("--itl-ms=5",) and plain.env == {}
    daemon = FleetSpec(sim_args=("--load-format=ipc_cache",)).initial_bundle  # vLLM refuses sleep mode there
    assert daemon.engine_args == ("--load-format=ipc_cache",) and daemon.env == {"VLLM_SERVER_DEV_MODE": "1"}
