"""`supervisor.unanswered_seconds` in `corral k8s render`: the supervisor's --unanswered-seconds, parsed
by the real CLI; the default renders no flag, so rendered commands stay as they were."""

from __future__ import annotations

from corral.supervisor.cli import run_command as supervise_run_command
from tests.unit.test_k8s_render_manifests import _parse, build, engine_container, seed
from tests.unit.test_k8s_render_startup_failure import with_supervisor


def test_the_default_renders_no_flag_and_the_supervisor_uses_its_own() -> None:
    _, _, manifests = build(seed())
    command = engine_container(manifests)["command"]
    assert "--unanswered-seconds" not in command[: command.index("--")]
    assert _parse(supervise_run_command, command[3:])["unanswered_seconds"] == 5.0


def test_a_configured_limit_reaches_the_supervisor() -> None:
    for seconds, flag in ((3, "3"), (0, "0")):
        _, _, manifests = build(with_supervisor(unanswered_seconds=seconds))
        command = engine_container(manifests)["command"]
        before_engine = command[: command.index("--")]
        assert before_engine[before_engine.index("--unanswered-seconds") + 1] == flag
        assert _parse(supervise_run_command, command[3:])["unanswered_seconds"] == seconds
