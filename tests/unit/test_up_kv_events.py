"""`corral up --policy prefix` gives each engine KV events on Unix sockets in the fleet's log directory."""

from __future__ import annotations

import typing
from pathlib import Path

import click
import orjson

from corral.fleet.local.fleet_config import RouterConfig
from corral.fleet.local.kv_events import kv_events_args
from corral.fleet.local.up import up
from corral.policy_names import POLICY_NAMES


def test_events_go_on_unix_sockets_in_the_log_directory() -> None:
    flag, text = kv_events_args(Path("/tmp/corral-up-x"), "engine-3", ["--enable-sleep-mode"])
    config = orjson.loads(text)
    assert flag == "--kv-events-config" and config["enable_kv_cache_events"] is True
    assert config["endpoint"] == "ipc:///tmp/corral-up-x/engine-3.kv"
    assert config["replay_endpoint"] == "ipc:///tmp/corral-up-x/engine-3.kv-replay"


def test_a_bundle_with_its_own_config_or_a_path_too_long_for_a_socket_gets_none() -> None:
    own = ["--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}']
    assert kv_events_args(Path("/tmp/x"), "engine-0", own) == []
    assert kv_events_args(Path("/tmp/x"), "engine-0", ["--kv-events-config={}"]) == []
    assert kv_events_args(Path("/tmp/" + "d" * 100), "engine-0", []) == []


def test_a_local_fleet_offers_every_router_policy() -> None:
    configured = typing.get_args(RouterConfig.model_fields["policy"].annotation)
    offered = next(p for p in up.params if p.name == "policy").type
    assert isinstance(offered, click.Choice)
    assert tuple(offered.choices) == tuple(POLICY_NAMES) == tuple(configured)
