"""LoraRegistry: vLLM's load/unload rules, per-adapter generators, usage counts; `--lora-modules` specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.sim.core.lora import LoraRegistry, parse_lora_module
from corral.sim.core.requests import RequestError


def _reg(enabled: bool = True) -> LoraRegistry:
    return LoraRegistry("base", enabled, 2, 0, 16)


def test_load_then_unload(tmp_path: Path) -> None:
    reg = _reg()
    assert reg.load("a", str(tmp_path)) == "Success: LoRA adapter 'a' added successfully."
    adapter = reg.get("a")
    assert adapter is not None and adapter.path == str(tmp_path) and adapter.base_model == "base"
    assert reg.unload("a") == "Success: LoRA adapter 'a' removed successfully."
    assert reg.get("a") is None


@pytest.mark.parametrize(
    ("name", "path", "status", "message"),
    [
        ("", "/x", 400, "Both 'lora_name' and 'lora_path' must be provided."),
        ("a", "", 400, "Both 'lora_name' and 'lora_path' must be provided."),
        ("base", "/x", 400, "The lora adapter 'base' conflicts with a served base model."),
        ("a", "/tmp/does-not-exist-xyz", 404, "Loading lora a failed: No adapter found for <path>"),
    ],
)
def test_load_refusals(name: str, path: str, status: int, message: str) -> None:
    with pytest.raises(RequestError) as err:
        _reg().load(name, path)
    assert (err.value.status, err.value.message) == (status, message)


def test_loading_a_name_twice_needs_load_inplace_and_keeps_the_id(tmp_path: Path) -> None:
    reg = _reg()
    reg.load("a", str(tmp_path))
    first = reg.get("a")
    with pytest.raises(RequestError) as err:
        reg.load("a", str(tmp_path))
    assert err.value.status == 400 and "has already been loaded" in err.value.message
    reg.load("a", str(tmp_path), load_inplace=True)
    again = reg.get("a")
    assert first is not None and again is not None and again.int_id == first.int_id


def test_without_enable_lora_the_engine_refuses_with_500(tmp_path: Path) -> None:
    with pytest.raises(RequestError) as err:
        _reg(enabled=False).load("a", str(tmp_path))
    assert err.value.status == 500 and "--enable-lora" in err.value.message


def test_unload_refusals() -> None:
    reg = _reg()
    with pytest.raises(RequestError) as err:
        reg.unload("")
    assert err.value.status == 400
    with pytest.raises(RequestError) as err:
        reg.unload("ghost")
    assert (err.value.status, err.value.message) == (404, "The lora adapter 'ghost' cannot be found.")


def test_each_adapter_writes_its_own_text(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reg = _reg()
    reg.load("a", str(tmp_path / "a"))
    reg.load("b", str(tmp_path / "b"))
    a, b = reg.get("a"), reg.get("b")
    assert a is not None and b is not None
    plan_a = a.generator.plan([1, 2, 3], 12, 100)
    assert plan_a.text == a.generator.plan([1, 2, 3], 12, 100).text
    assert plan_a.text != b.generator.plan([1, 2, 3], 12, 100).text


def test_usage_counts_move_from_waiting_to_running_to_gone() -> None:
    reg = _reg()
    reg.request_waiting("a")
    assert reg.waiting_names() == ["a"] and reg.running_names() == []
    reg.request_running("a")
    assert reg.waiting_names() == [] and reg.running_names() == ["a"]
    reg.request_done("a", was_running=True)
    assert reg.running_names() == []


def test_lora_module_specs() -> None:
    assert parse_lora_module("a=/models/a") == ("a", "/models/a")
    assert parse_lora_module('{"name": "b", "path": "/models/b"}') == ("b", "/models/b")
    with pytest.raises(ValueError):
        parse_lora_module("{oops")
