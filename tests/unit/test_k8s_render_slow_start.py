"""`router.slow_start_seconds` in corral.yaml reaches the rendered router Deployment as the router's own
`--slow-start-seconds` (read back through the router's CLI, as the pod would parse it); unset, the
router keeps its default (off) and the flag is not rendered; a value the router would refuse is refused
by render, naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from corral.k8s.render.config_reading import ConfigError, parse_config
from corral.router.cli import router as router_command
from tests.unit.test_k8s_render_hardening import _parse, main_container, router_pod
from tests.unit.test_k8s_render_manifests import seed


def router_params(data: dict[str, Any]) -> dict[str, Any]:
    command = main_container(router_pod(data))["command"]
    assert command[:2] == ["corral", "router"], command
    return _parse(router_command, command[2:])


def test_unset_the_router_keeps_its_default_slow_start_off() -> None:
    command = main_container(router_pod(seed()))["command"]
    assert "--slow-start-seconds" not in command
    assert router_params(seed())["slow_start_seconds"] == 0.0


@pytest.mark.parametrize("seconds", [30, 2.5, 3600])
def test_router_slow_start_seconds_is_the_rendered_routers_ramp(seconds: float) -> None:
    data = seed()
    data["router"]["slow_start_seconds"] = seconds
    assert router_params(data)["slow_start_seconds"] == float(seconds)


@pytest.mark.parametrize("bad", [-1, 3601, float("nan"), float("inf"), "30", True, None, [30]])
def test_a_slow_start_the_router_would_refuse_is_refused_naming_the_key(bad: Any) -> None:
    data = seed()
    data["router"]["slow_start_seconds"] = bad
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "router.slow_start_seconds" in str(caught.value)
