"""The rendered router carries the fleet's runtime LoRA adapters to a pod that joins later: it gets
`--carry-adapters-seconds` (with the fleet key that opens each pod's supervisor), whatever
corral.yaml's `engine.lora` says, since `corral lora load` can add adapters to any fleet."""

from __future__ import annotations

from typing import Any

import pytest

from corral.k8s.render.commands import CARRY_ADAPTERS_SECONDS
from corral.router.cli import router as router_command
from tests.unit.test_k8s_render_hardening import _parse, main_container, router_pod
from tests.unit.test_k8s_render_router_access import CASES, IDS


@pytest.mark.parametrize("data", CASES, ids=IDS)
def test_the_router_holds_joining_pods_until_the_fleets_adapters_are_there(data: dict[str, Any]) -> None:
    params = _parse(router_command, main_container(router_pod(data))["command"][2:])
    assert params["carry_adapters_seconds"] == CARRY_ADAPTERS_SECONDS > 0
    assert params["supervisor_token_key_file"]  # the carry loads through each pod's own supervisor
    assert params["discovery"] == "k8s"
