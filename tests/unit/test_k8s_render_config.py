"""Bad `corral.yaml` files are refused with the field's path, the value found and what to do, and the
CLI exits 2 without writing anything."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from corral.cli import main
from corral.k8s.render.config_reading import ConfigError, load_config, parse_config

SEED = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "wait-for-kv-cache" / "corral.yaml"


def seed() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SEED.read_text(encoding="utf-8"))
    return data


def problems_of(data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return str(caught.value)


def test_seed_example_is_valid() -> None:
    config = load_config(SEED)
    assert config.engine.gpus == 1
    assert config.dependencies.wait_for == [
        "unix:/var/run/vineyard.sock",
        "tcp:aibrix-kvcache-llama-3-8b-instruct-rpc:9600",
    ]
    assert config.token_secret == "llama-3-8b-instruct-corral-token"


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    if value is _DELETE:
        del data[leaf]
    else:
        data[leaf] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("startup.read_gbps", 0, ["startup.read_gbps: 0:", "greater than 0", "GB/s"]),
        ("drain.longest_stream_seconds", _DELETE, ["drain.longest_stream_seconds: (missing): required"]),
        ("startup.read_gpbs", 1.0, ["startup.read_gpbs", "not a config field", "read_gbps"]),
        ("replicas", 4, ["replicas: 4:", "= 4 GPUs, more than gpu.capacity 3"]),
        ("engine.args", ["--port", "9000"], ["engine.args", "set it with engine.port"]),
        ("engine.args", ["--api-key=abc"], ["engine.args", "engine.secret_env"]),
        ("engine.env", {"HF_TOKEN": "hf_abc"}, ["engine.env", "HF_TOKEN looks like a secret", "secret_env"]),
        ("engine.env", {"1BAD": "x"}, ["engine.env", "not an environment variable name"]),
        (
            "engine.secret_env",
            {"HF_TOKEN": {"secret_name": "hf"}},
            ["engine.secret_env.HF_TOKEN.key", "required"],
        ),
        ("dependencies.wait_for", ["redis:cache:6379"], ["dependencies.wait_for", "unknown dependency kind"]),
        ("dependencies.wait_for", ["tcp:cache"], ["dependencies.wait_for", "expected tcp:HOST:PORT"]),
        ("dependencies.wait_for", ["unix:/run/other.sock"], ["dependencies.wait_for[0]", "not under any"]),
        ("name", "Llama_3", ["name: 'Llama_3':", "lower-case letters"]),
        ("name", "a" * 60, ["name:", "at most 51 characters"]),
        ("router.policy", "random", ["router.policy: 'random':", "least_request"]),
        ("supervisor.port", 8000, ["supervisor.port: 8000:", "engine already uses this port"]),
        ("drain.propagation_seconds", 1, ["drain.propagation_seconds: 1.0:", "readiness"]),
        ("drain.policy", "keep", ["drain.policy: 'keep':", "'wait' or 'abort'"]),
        ("startup.margin", 0.5, ["startup.margin: 0.5:", "safety factor"]),
        ("gpu.capacity", "two", ["gpu.capacity: 'two':", "valid integer"]),
        ("labels", {"team": "a b"}, ["labels", "not a label value"]),
        (
            "engine.volumes",
            [{"name": "x", "host_path": "rel", "mount_path": "/x"}],
            ["engine.volumes[0].host_path"],
        ),
    ],
)
def test_bad_config_names_the_field(path: str, value: Any, expected: list[str]) -> None:
    data = copy.deepcopy(seed())
    _set(data, path, value)
    message = problems_of(data)
    for text in expected:
        assert text in message, message


def test_every_problem_is_reported_at_once() -> None:
    data = copy.deepcopy(seed())
    data["startup"]["read_gbps"] = -1
    data["router"]["replicas"] = 0
    data["image"] = ""
    message = problems_of(data)
    assert "3 problem(s)" in message
    for field in ("startup.read_gbps", "router.replicas", "image"):
        assert f"  {field}:" in message


def test_top_level_must_be_a_mapping() -> None:
    assert "(top level): 'list': expected a mapping" in problems_of([1, 2])


def _run(args: list[str]) -> Any:
    return CliRunner().invoke(main, ["k8s", "render", *args])


def test_cli_exits_2_on_a_bad_config_and_writes_nothing(tmp_path: Path) -> None:
    data = copy.deepcopy(seed())
    data["gpu"]["capacity"] = 0
    config = tmp_path / "corral.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = tmp_path / "rendered"
    result = _run(["--config", str(config), "--out", str(out)])
    assert result.exit_code == 2
    # the refusal is the contract: one line naming the value and what to do
    assert "gpu.capacity: 0:" in result.stderr
    assert "greater than or equal to 1" in result.stderr
    assert not out.exists()


def test_cli_exits_2_on_yaml_it_cannot_parse(tmp_path: Path) -> None:
    config = tmp_path / "corral.yaml"
    config.write_text("name: [unclosed\n", encoding="utf-8")
    result = _run(["--config", str(config)])
    assert result.exit_code == 2
    # the refusal is the contract: one line naming the value and what to do
    assert "not valid YAML" in result.stderr
    assert result.stdout == ""


def test_cli_exits_2_on_a_missing_file(tmp_path: Path) -> None:
    result = _run(["--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    # the refusal is the contract: one line naming the value and what to do
    assert "unreadable" in result.stderr
