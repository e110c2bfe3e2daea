"""fleet.yaml: each field reaches the `corral up` option it names, and a bad file is refused with the
file, the field's path, the value and what to write."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.fleet.local.fleet_config import FleetConfigError, config_bundle, load_fleet_config, up_values

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local" / "fleet.yaml"


def test_the_example_maps_to_up_options() -> None:
    config, given = load_fleet_config(EXAMPLE)
    values = up_values(config, EXAMPLE, given)
    assert values["engines"] == 4 and values["group_size"] == 2 and values["policy"] == "least_request"
    assert "--slow-start-seconds=5.0" in values["router_args"]
    bundle = config_bundle(config, EXAMPLE)
    assert bundle is not None and bundle.engine_args == ("--itl-ms", "2")


def test_only_fields_the_file_sets_are_used(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("model: m2\ngate: false\n")
    config, given = load_fleet_config(path)
    assert up_values(config, path, given) == {"model": "m2", "no_gate": True}


def test_a_bundle_path_is_relative_to_the_fleet_file(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("name: v2\nengine_args: ['--itl-ms', '1']\n")
    path = tmp_path / "fleet.yaml"
    path.write_text("bundle: b.yaml\n")
    config, _ = load_fleet_config(path)
    bundle = config_bundle(config, path)
    assert bundle is not None and bundle.name == "v2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engines: {count: 0}\n", r"fleet.yaml: engines.count: .*greater than or equal to 1; it is 0"),
        ("router: {policy: fastest}\n", r"router.policy: .*'fastest'"),
        ("engine: 2\n", r"fleet.yaml: engine: no such field \(see docs/fleet-yaml.md"),
        ("port: [1]\n", r"port: .*it is \[1\]"),
        ("- a\n", r"write a mapping"),
        ("port: [\n", r"not valid YAML"),
    ],
)
def test_bad_files_are_refused_with_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(FleetConfigError, match=message):
        load_fleet_config(path)


def test_a_bad_inline_bundle_says_what_to_write(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("bundle: {name: v, engine_args: 'a string'}\n")
    config, _ = load_fleet_config(path)
    with pytest.raises(FleetConfigError, match=r"fleet.yaml: bundle: engine_args: write a list of strings"):
        config_bundle(config, path)
