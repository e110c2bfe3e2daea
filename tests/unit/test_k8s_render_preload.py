"""`preload:` in `corral k8s render` (issue 29 item 5): vLLM's weight-cache daemon rendered into every
engine pod as the supervisor's --preload-command (parsed by the real supervisor CLI), the engine loading
`--load-format ipc_cache` in the configured mode, and a daemon command PRECHECK's own pair comparison
finds identical to the engine's (model, revision, dtype, quantization, TP, DP, EP). Configs that cannot
work are refused naming the field and the fix."""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

from corral.engine.flags import serving_settings
from corral.supervisor.cli import run_command as supervise_run_command
from corral.supervisor.precheck.preload_pair import _flags
from tests.unit.test_k8s_render_config import problems_of
from tests.unit.test_k8s_render_manifests import _parse, build, engine_container, seed


def with_preload(engine_args: list[str] | None = None, **preload: Any) -> dict[str, Any]:
    data = copy.deepcopy(seed())
    data["preload"] = {"enabled": True, **preload}
    if engine_args is not None:
        data.setdefault("engine", {})["args"] = engine_args
    return data


def test_off_by_default_renders_nothing() -> None:
    command = engine_container(build(seed())[2])["command"]
    assert "--preload-command" not in command and "ipc_cache" not in command


def test_the_daemon_is_the_supervisors_and_agrees_with_the_engine() -> None:
    args = ["--dtype", "bfloat16", "-q", "fp8", "--enable-expert-parallel", "--max-model-len", "8192"]
    config, _, manifests = build(with_preload(args, mode="copy", fallback=False, health_port=8111))
    command = engine_container(manifests)["command"]
    params = _parse(supervise_run_command, command[3:])
    assert params["preload_health"] == "http://127.0.0.1:8111/health"
    daemon = shlex.split(params["preload_command"])
    assert daemon[:4] == ["vllm", "preload", "--model", config.model.path]
    assert "--weight-cache-health-port" in daemon and "8111" in daemon
    assert "--max-model-len" not in daemon  # only what the cache key compares
    engine = command[command.index("--") + 1 :]
    loader = engine[engine.index("--model-loader-extra-config") + 1]
    assert engine[engine.index("--load-format") + 1] == "ipc_cache"
    assert json.loads(loader) == {"mode": "copy", "fallback": False}
    pairs, differ = _flags(serving_settings(engine), serving_settings(daemon))
    assert differ == [], differ
    assert pairs["quantization"] == {"engine": "fp8", "daemon": "fp8"}
    assert pairs["expert_parallel"] == {"engine": True, "daemon": True}


def test_configs_that_cannot_work_are_refused_with_the_fix() -> None:
    sleep = problems_of(with_preload(["--enable-sleep-mode"]))
    assert "zero_copy with --enable-sleep-mode" in sleep and "use preload.mode copy" in sleep
    assert "--load-format in engine.args is set by preload" in problems_of(
        with_preload(["--load-format", "auto"])
    )
    pp = with_preload()
    pp.setdefault("engine", {})["pipeline_parallel_size"] = 2
    assert "serves no pipeline parallelism" in problems_of(pp)
    assert "health_port" in problems_of(with_preload(health_port=0))
    assert "mode" in problems_of(with_preload(mode="mmap"))
    assert "socket" in problems_of(with_preload(socket="/tmp/x"))  # unknown keys are refused


def test_the_daemon_wait_is_in_the_startup_window_and_a_short_deadline_is_warned() -> None:
    data = with_preload()
    data["dependencies"] = {"wait_for": [], "timeout_seconds": 5}
    _, budgets, _ = build(data)
    plain = copy.deepcopy(data)
    plain["preload"] = {"enabled": False}
    _, without, _ = build(plain)
    # the supervisor waits for its /health (once per start: the restart overshoot counts it again)
    assert budgets.startup_window == without.startup_window + 5 * (1 + budgets.startup_restarts)
    (warning,) = [w for w in budgets.warnings if w.startswith("preload:")]
    assert "dependencies.timeout_seconds is 5" in warning and "raise dependencies.timeout_seconds" in warning
    data["dependencies"]["timeout_seconds"] = 3600
    assert not [w for w in build(data)[1].warnings if w.startswith("preload:")]
