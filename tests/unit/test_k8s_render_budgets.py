"""The probe, drain and rollout numbers of `corral k8s render` follow from the config by their formulas:
checked once by hand on the wait-for-kv-cache example, then by moving one input and watching the number
move."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.k8s.render import budgets as b
from corral.k8s.render.config_reading import parse_config
from corral.supervisor.lifecycle.config import SupervisorConfig
from corral.supervisor.lifecycle.engine_process import RestartPolicy

SEED = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "wait-for-kv-cache" / "corral.yaml"


def seed() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SEED.read_text(encoding="utf-8"))
    return data


def derive(data: dict[str, Any]) -> b.Budgets:
    return b.derive(parse_config(data))


def changed(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(seed())
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def test_seed_numbers_worked_by_hand() -> None:
    got = derive(seed())
    read = 15 * 2**30 / 1e9  # 16.106 s for 15 GiB at 1 GB/s
    attempt = read + 60 + 0 + 0 + 30 + 30 + 10  # 146.106 s
    assert got.startup_timeout == math.ceil(1.5 * (0 + 2 * attempt) + 1) == 440
    # gates 300 + startup 440 + engine stop 30 + one restart's overshoot (backoff 1 + gates 300)
    assert got.startup_window == 300 + 440 + 30 + 1 + 300
    assert got.startup_failure_threshold == math.ceil(1071 / 10) + 1 == 109
    assert got.propagation_timeout == 2 * 1 + 5 + 1
    # propagation 8 + longest stream 300 + engine stop 30, + 10 prestop slack, + 10 exit slack
    assert got.prestop_timeout == 348
    assert got.termination_grace == 358
    assert (got.rollout.max_surge, got.rollout.max_unavailable, got.rollout.spare_gpus) == (1, 0, 1)
    assert got.progress_deadline == 1071 + 60
    assert got.router_grace == 5 + 300 + 10


def test_transfer_is_gib_over_gb_per_second() -> None:
    assert b.transfer_seconds(1, 1) == pytest.approx(1.073741824)
    assert b.transfer_seconds(100, 2.5) == pytest.approx(100 * 2**30 / 2.5e9)


@pytest.mark.parametrize(
    "field",
    [
        "startup.process_start_seconds",
        "startup.quantization_seconds",
        "startup.compile_seconds",
        "startup.graph_capture_seconds",
        "startup.warmup_seconds",
        "startup.smoke_seconds",
    ],
)
def test_each_load_phase_moves_the_startup_budget_by_margin_times_loads(field: str) -> None:
    base = derive(seed())
    section, name = field.split(".")
    more = derive(changed(field, seed()[section][name] + 100))
    # 1.5 margin × (1 + 1 restart) full loads × 100 s, give or take the ceiling
    assert more.startup_timeout - base.startup_timeout == pytest.approx(300, abs=1)
    assert more.startup_window - base.startup_window == more.startup_timeout - base.startup_timeout


def test_slower_disk_and_bigger_weights_lengthen_the_load() -> None:
    base = derive(seed())
    half_speed = derive(changed("startup.read_gbps", 0.5))
    read = 15 * 2**30 / 1e9
    assert half_speed.startup_timeout - base.startup_timeout == pytest.approx(1.5 * 2 * read, abs=1)
    double = derive(changed("model.weights_gib", 30.0))
    assert double.startup_timeout == half_speed.startup_timeout


def test_download_counts_once_not_per_restart() -> None:
    base = derive(seed())
    got = derive(changed("startup.download_gbps", 0.1))
    download = 15 * 2**30 / 0.1e9
    assert got.startup_timeout - base.startup_timeout == pytest.approx(1.5 * download, abs=1)


def test_restarts_add_a_full_load_and_a_backoff() -> None:
    none = derive(changed("startup.restarts", 0))
    three = derive(changed("startup.restarts", 3))
    attempt = 15 * 2**30 / 1e9 + 130
    assert none.startup_timeout == math.ceil(1.5 * attempt)
    assert three.startup_timeout == math.ceil(1.5 * 4 * attempt + 1 + 2 + 4)
    # without restarts there is no overshoot past the startup deadline
    assert none.startup_window == 300 + none.startup_timeout + 30
    assert three.startup_window == 300 + three.startup_timeout + 30 + 4 + 300


def test_no_dependencies_means_no_gate_wait_in_the_window() -> None:
    data = changed("dependencies.wait_for", [])
    got = derive(data)
    # startup deadline + engine stop + the last restart's backoff (no gates to wait for again)
    assert got.startup_window == got.startup_timeout + 30 + 1


def test_margin_scales_the_load() -> None:
    assert derive(changed("startup.margin", 3.0)).startup_timeout == math.ceil(
        3.0 * 2 * (15 * 2**30 / 1e9 + 130) + 1
    )


def test_backoffs_mirror_the_supervisors_restart_policy() -> None:
    policy = RestartPolicy(6, 1.5, SupervisorConfig(engine_argv=()).restart_backoff_cap)
    expected = tuple(policy.next_backoff() for _ in range(6))
    assert b.backoff_schedule(6, 1.5) == expected


@settings(max_examples=300, deadline=None)
@given(
    window=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    period=st.integers(min_value=1, max_value=600),
)
def test_startup_probe_never_fires_inside_the_window(window: float, period: int) -> None:
    threshold = b.probe_failure_threshold(window, period)
    assert (threshold - 1) * period >= window
    assert (threshold - 2) * period < window  # and not much later than needed


def test_longest_stream_moves_the_grace_period_one_for_one() -> None:
    base = derive(seed())
    longer = derive(changed("drain.longest_stream_seconds", 900))
    assert longer.termination_grace - base.termination_grace == 600
    assert longer.prestop_timeout - base.prestop_timeout == 600
    assert longer.drain_timeout == 900


def test_engine_shutdown_and_propagation_move_the_grace_period() -> None:
    base = derive(seed())
    assert (
        derive(changed("drain.engine_shutdown_seconds", 90)).termination_grace - base.termination_grace == 60
    )
    assert derive(changed("drain.propagation_seconds", 20)).termination_grace - base.termination_grace == 12


def test_abort_policy_does_not_wait_for_streams() -> None:
    got = derive(changed("drain.policy", "abort"))
    assert got.prestop_timeout == math.ceil(8 + 0 + 30 + 10)
    assert got.termination_grace == got.prestop_timeout + 10


def test_propagation_is_derived_from_the_readiness_probe() -> None:
    data = changed("probes.readiness_period_seconds", 5)
    data["probes"]["readiness_failure_threshold"] = 2
    got = derive(data)
    assert got.propagation_timeout == 5 * 2 + b.ROUTER_WATCH_SECONDS + 1


def test_grace_always_outlasts_the_prestop_hook() -> None:
    for stream in (1, 60, 3600):
        got = derive(changed("drain.longest_stream_seconds", stream))
        assert got.termination_grace > got.prestop_timeout >= got.propagation_timeout + stream + 30


@pytest.mark.parametrize(
    ("replicas", "gpus", "capacity", "max_unavailable", "cap", "surge", "unavailable"),
    [
        (2, 1, 3, 1, None, 1, 0),  # wait-for-kv-cache: one spare GPU, surge one engine, lose nothing
        (4, 2, 8, 1, None, 0, 1),  # full: one engine at a time goes down first
        (4, 2, 8, 2, None, 0, 2),
        (4, 2, 12, 1, None, 2, 0),  # 4 spare GPUs = 2 engines of 2 GPUs
        (4, 2, 11, 1, None, 1, 0),  # 3 spare GPUs hold only 1 engine of 2
        (4, 1, 100, 1, None, 4, 0),  # never more surge than replicas
        (4, 1, 100, 1, 1, 1, 0),  # the config's cap
        (4, 1, 100, 1, 0, 0, 1),  # cap 0: no surge even with room
        (1, 1, 1, 1, None, 0, 1),
        (2, 1, 2, 5, None, 0, 2),  # unavailability never above replicas
    ],
)
def test_rolling_update_from_gpu_capacity(
    replicas: int,
    gpus: int,
    capacity: int,
    max_unavailable: int,
    cap: int | None,
    surge: int,
    unavailable: int,
) -> None:
    got = b.rolling_update(replicas, gpus, capacity, max_unavailable, cap)
    assert (got.max_surge, got.max_unavailable) == (surge, unavailable)
    assert got.spare_gpus == capacity - replicas * gpus
    # a surge never asks for GPUs that are not there
    assert (replicas + got.max_surge) * gpus <= capacity


def test_rolling_update_refuses_more_engines_than_gpus() -> None:
    with pytest.raises(ValueError, match="need 6 GPUs"):
        b.rolling_update(3, 2, 4, 1, None)


def test_tensor_parallel_engines_need_more_gpus_per_surge() -> None:
    data = changed("engine.tensor_parallel_size", 2)
    data["replicas"] = 1
    data["gpu"]["capacity"] = 4
    got = derive(data)
    assert (got.rollout.spare_gpus, got.rollout.max_surge, got.rollout.max_unavailable) == (2, 1, 0)
    data["gpu"]["capacity"] = 3
    got = derive(data)
    assert (got.rollout.max_surge, got.rollout.max_unavailable) == (0, 1)
    assert any("raise gpu.capacity by 2" in w for w in got.warnings)


def test_explain_lists_every_number_it_derived() -> None:
    got = derive(seed())
    names = [s.name for s in got.steps]
    for name in (
        "--startup-timeout",
        "startupProbe.failureThreshold",
        "terminationGracePeriodSeconds",
        "maxSurge",
        "maxUnavailable",
    ):
        assert name in names
    values = {s.name: s.value for s in got.steps}
    assert values["terminationGracePeriodSeconds"] == got.termination_grace
    assert values["startupProbe.failureThreshold"] == got.startup_failure_threshold
