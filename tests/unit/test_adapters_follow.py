"""Adapters follow the fleet: the fleet's desired set is the union of its supervisors' (one path per
name, or a refusal naming the adapter); `corral verify` fails on an adapter the last change record
served and an engine no longer serves, unless its removal was allowed, and a loss stays a loss in the
next record; the control API's `adapters` field is checked; the Kubernetes render carries engine.lora
as the supervisor's --lora, with the engine able to load them, and refuses a path no volume holds."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from corral.contracts.fleet_adapters import AdapterConflict, fleet_adapter_set
from corral.contracts.supervisor import SupervisorState
from corral.contracts.up import AddGroupRequest
from corral.fleet.checks.adapters import KeptAdapters, adapter_baseline, last_adapters, recorded_adapters
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.verify import FAIL, PASS, Expectations, check_adapters_kept
from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.k8s.render.manifests import render

SEED = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "wait-for-kv-cache" / "corral.yaml"


def state(desired: dict[str, str]) -> SupervisorState:
    return SupervisorState.model_validate(
        {"state": "READY", "epoch": 1, "adapters": {"desired": desired, "served": sorted(desired)}}
    )


def test_the_fleet_set_is_the_union_and_two_paths_for_one_name_are_refused() -> None:
    states = [
        ("engine-0", state({"sql": "/a/sql"})),
        ("engine-1", state({"sql": "/a/sql", "chat": "/a/chat"})),
        ("engine-2", SupervisorState.model_validate({"state": "READY", "epoch": 1})),  # before adapters
    ]
    assert fleet_adapter_set(states) == {"chat": "/a/chat", "sql": "/a/sql"}
    with pytest.raises(AdapterConflict, match=r"'sql'.*'/a/sql' on engine-0.*'/b/sql' on engine-1"):
        fleet_adapter_set([states[0], ("engine-1", state({"sql": "/b/sql"}))])


def engine(name: str, adapters: list[str] | None) -> EngineView:
    models = None if adapters is None else [{"id": "m"}, *({"id": a, "parent": "m"} for a in adapters)]
    return EngineView(name, f"http://{name}:1", f"http://{name}:2", state={"state": "READY"}, models=models)


def view(*engines: EngineView) -> FleetView:
    return FleetView(FleetTarget(None, []), list(engines))


def test_verify_fails_naming_a_lost_adapter_and_passes_an_allowed_removal() -> None:
    fleet = view(engine("engine-0", ["chat"]), engine("engine-1", ["chat"]))
    kept = KeptAdapters(frozenset({"sql", "chat"}), "rollout /r.json")
    check = check_adapters_kept(fleet, Expectations(kept_adapters=kept))
    assert check.verdict == FAIL
    assert "'sql' not served by engine-0, engine-1" in check.detail and "rollout /r.json" in check.detail
    assert "--allow-adapter-removal" in check.detail
    allowed = KeptAdapters(kept.names, kept.source, frozenset({"sql"}))
    check = check_adapters_kept(fleet, Expectations(kept_adapters=allowed))
    assert check.verdict == PASS and "removed on purpose: sql" in check.detail
    # one engine of two lost it: named alone
    partial = view(engine("engine-0", ["chat", "sql"]), engine("engine-1", ["chat"]))
    assert "not served by engine-1 " in check_adapters_kept(partial, Expectations(kept_adapters=kept)).detail
    assert check_adapters_kept(fleet, Expectations()).verdict == PASS  # no record: nothing to lose


def test_the_newest_record_that_lists_adapters_is_the_baseline_and_a_loss_stays_in_it() -> None:
    rollout = {"kind": "rollout", "finished": 20.0, "adapters": {"carried": {"sql": "/a"}, "served": ["sql"]}}
    old_verify = {"kind": "verify", "finished": 10.0, "engines": [{"adapters": ["chat"]}, {"adapters": []}]}
    assert recorded_adapters(old_verify) == {"chat"}  # a verify record from before `adapters`
    assert recorded_adapters({"kind": "verify", "finished": 1.0}) is None
    kept = last_adapters([("v.json", old_verify), ("r.json", rollout), ("x.json", None)], ["chat"])
    assert kept == KeptAdapters(frozenset({"sql"}), "rollout r.json", frozenset({"chat"}))
    assert last_adapters([("x.json", None)]) is None
    other = {**rollout, "router": "http://10.0.0.9:8000", "finished": 30.0}
    assert last_adapters(
        [("o.json", other), ("r.json", rollout)], (), "http://127.0.0.1:8000"
    ) == KeptAdapters(frozenset({"sql"}), "rollout r.json")
    # a failed verify writes the lost adapter into its record: the next verify still misses it
    assert adapter_baseline(kept, [[], ["chat"]]) == ["chat", "sql"]
    allowed = KeptAdapters(kept.names, kept.source, frozenset({"sql"}))
    assert adapter_baseline(allowed, [[]]) == []


def test_the_control_api_reads_adapters_as_a_mapping_of_names_to_paths() -> None:
    asked = AddGroupRequest.model_validate({"bundle": {"name": "v2"}, "adapters": {"sql": "/a/sql"}})
    assert asked.adapters == {"sql": "/a/sql"}
    assert AddGroupRequest.model_validate({"bundle": {"name": "v2"}}).adapters is None
    for bad in (["sql"], {"sql": ""}, {"": "/a"}, {"sql": 1}):
        with pytest.raises(ValidationError, match="a mapping of adapter name to path"):
            AddGroupRequest.model_validate({"bundle": {"name": "v2"}, "adapters": bad})


def seed(**engine: Any) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(SEED.read_text(encoding="utf-8")))
    data["engine"].update(engine)
    return data


def engine_container(data: dict[str, Any]) -> dict[str, Any]:
    config = parse_config(data)
    manifests = {m.filename: m.obj for m in render(config, derive(config))}
    container: dict[str, Any] = manifests["engine-deployment.yaml"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    return container


def test_the_render_carries_engine_lora_to_the_supervisor() -> None:
    lora = [{"name": "sql", "path": "/models/lora/sql"}, {"name": "chat", "path": "/models/lora/chat"}]
    container = engine_container(seed(lora=lora))
    command: list[str] = container["command"]
    split = command.index("--")
    supervisor, engine_argv = command[:split], command[split + 1 :]
    pairs = [supervisor[i + 1] for i, arg in enumerate(supervisor) if arg == "--lora"]
    assert pairs == ["sql=/models/lora/sql", "chat=/models/lora/chat"]
    assert engine_argv.count("--enable-lora") == 1
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"} in container["env"]
    # without adapters, nothing of it
    plain = engine_container(seed())
    assert "--lora" not in plain["command"] and "--enable-lora" not in plain["command"]
    assert all(e["name"] != "VLLM_ALLOW_RUNTIME_LORA_UPDATING" for e in plain["env"])
    # --enable-lora already in args is not doubled
    container = engine_container(seed(lora=lora[:1], args=["--enable-lora", "--max-loras", "2"]))
    assert container["command"].count("--enable-lora") == 1


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        (
            {"lora": [{"name": "sql", "path": "/elsewhere/sql"}]},
            "engine.lora[0].path: '/elsewhere/sql': not under",
        ),
        (
            {"lora": [{"name": "sql", "path": "lora/sql"}]},
            "engine.lora[0].path: 'lora/sql': String should match pattern '^/' (an absolute",
        ),
        ({"lora": [{"name": "a=b", "path": "/models/x"}]}, "engine.lora[0].name: 'a=b'"),
        (
            {"lora": [{"name": "sql", "path": "/models/a"}, {"name": "sql", "path": "/models/b"}]},
            "adapter 'sql' is listed twice",
        ),
        (
            {
                "lora": [{"name": "sql", "path": "/models/a"}],
                "env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"},
            },
            "engine.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING: '0': engine.lora needs it",
        ),
    ],
)
def test_the_render_refuses_bad_adapters_naming_the_field(engine: dict[str, Any], expected: str) -> None:
    data = seed(**{k: v for k, v in engine.items() if k != "env"})
    data["engine"].setdefault("env", {}).update(engine.get("env", {}))
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert expected in str(caught.value)
