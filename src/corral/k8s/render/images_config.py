"""The `images` section of a `corral.yaml`: where the Corral images come from when the config names none.
`image` (the engine) and `router.image` still win when given. The images are built from
deploy/images/ (docs/images.md); their tags carry Corral's version, and the engine's also vLLM's."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The vLLM the engine image is built on (deploy/images/engine.Dockerfile's FROM line).
VLLM_VERSION = "0.32.0"
DEFAULT_REGISTRY = "ghcr.io/corral-project"


class ImagesSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    registry: str = Field(
        default=DEFAULT_REGISTRY,
        min_length=1,
        description="registry and path prefix of the Corral images used where image / router.image are left "
        "out: REGISTRY/corral-engine:VERSION-vllmVLLM and REGISTRY/corral-router:VERSION",
    )


def corral_version() -> str:
    return version("corral")


def engine_image(registry: str) -> str:
    return f"{registry.rstrip('/')}/corral-engine:{corral_version()}-vllm{VLLM_VERSION}"


def router_image(registry: str) -> str:
    return f"{registry.rstrip('/')}/corral-router:{corral_version()}"


def fill_default_images(data: Any) -> Any:
    """The raw config with `image` and `router.image` set to the Corral images where left out or null;
    anything malformed is passed on untouched, for the fields' own checks to report."""
    if not isinstance(data, dict):
        return data
    images = data.get("images")
    registry = images.get("registry", DEFAULT_REGISTRY) if isinstance(images, dict) else DEFAULT_REGISTRY
    if (images is not None and not isinstance(images, dict)) or not isinstance(registry, str) or not registry:
        return data
    filled = dict(data)
    if filled.get("image") is None:
        filled["image"] = engine_image(registry)
    router = filled.get("router")
    router = {} if router is None else router
    if isinstance(router, dict) and router.get("image") is None:
        filled["router"] = {**router, "image": router_image(registry)}
    return filled
