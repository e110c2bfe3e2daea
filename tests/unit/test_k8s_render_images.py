"""`corral k8s render`'s default images: the Corral engine and router images from `images.registry` where
the config names none, the config's own `image` / `router.image` where it does."""

from __future__ import annotations

import copy
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.k8s.render.budgets import derive
from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.k8s.render.manifests import render

SEED = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "wait-for-kv-cache" / "corral.yaml"
VERSION = version("corral")


def seed_without_images() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SEED.read_text(encoding="utf-8"))
    del data["image"]
    data["router"].pop("image", None)
    return data


def images_of(data: dict[str, Any]) -> dict[str, set[str]]:
    """Every container image of the rendered objects, by object kind and name."""
    found: dict[str, set[str]] = {}
    config = parse_config(data)
    for manifest in render(config, derive(config)):
        obj = manifest.obj
        spec = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            found.setdefault(obj["metadata"]["name"], set()).add(container["image"])
    return found


def test_left_out_images_default_to_the_corral_images() -> None:
    found = images_of(seed_without_images())
    engine = f"ghcr.io/corral-project/corral-engine:{VERSION}-vllm0.32.0"
    router = f"ghcr.io/corral-project/corral-router:{VERSION}"
    assert {name: images for name, images in found.items() if "router" in name} == {
        name: {router} for name in found if "router" in name
    }
    engine_images = {image for name, images in found.items() if "router" not in name for image in images}
    assert engine_images == {engine}


def test_the_registry_moves_both_defaults() -> None:
    data = seed_without_images()
    data["images"] = {"registry": "registry.example.com/team/"}
    images = {image for found in images_of(data).values() for image in found}
    assert images == {
        f"registry.example.com/team/corral-engine:{VERSION}-vllm0.32.0",
        f"registry.example.com/team/corral-router:{VERSION}",
    }


def test_explicit_images_win() -> None:
    data = copy.deepcopy(seed_without_images())
    data["image"] = "registry.example.com/my-vllm:1"
    data["router"]["image"] = "registry.example.com/my-router:2"
    images = {image for found in images_of(data).values() for image in found}
    assert images == {"registry.example.com/my-vllm:1", "registry.example.com/my-router:2"}


def test_an_unknown_images_field_is_reported() -> None:
    data = seed_without_images()
    data["images"] = {"regsitry": "x"}
    with pytest.raises(ConfigError, match=r"images\.regsitry"):
        parse_config(data)
