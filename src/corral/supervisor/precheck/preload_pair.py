"""PRECHECK's preload pair: the weight-cache daemon's command against the engine's (no pipeline
parallelism in the engine, the engine loads `--load-format ipc_cache` and the daemon from disk, same
model, revision, dtype, quantization, TP, DP and expert parallelism), the vLLM version and platform
each runs (CUDA or ROCm: the cache shares CUDA IPC handles), the GPUs their ranks sit on, and the
socket directory they share owned by this user with no group or world access. A figure one side does
not state is reported "not stated" and is not compared (`preload_identity` says what vLLM exposes).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.engine.flags import daemon_words, flag_value, loader_config, serving_settings
from corral.engine.gpus import GpuDevice, read_gpus
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.explain import Step, step_lines
from corral.supervisor.precheck.preload_identity import (
    IPC_PLATFORMS,
    NOT_STATED,
    Install,
    command_of,
    comparable,
    rank_gpus,
    read_install,
    shown,
)

NAME = "preload"
# what the engine and the daemon must agree on, with vLLM's default when the flag is absent
_PAIRED: tuple[tuple[str, str, str | bool | None], ...] = (
    ("model", "--model", None),
    ("revision", "--revision", None),
    ("dtype", "--dtype", "auto"),
    ("quantization", "--quantization", None),
    ("tensor_parallel_size", "--tensor-parallel-size", "1"),
    ("data_parallel_size", "--data-parallel-size", "1"),
    ("expert_parallel", "--enable-expert-parallel", False),
)
InstallReader = Callable[[Sequence[str], Mapping[str, str]], Install]


def socket_dir(engine_argv: Sequence[str], daemon_argv: Sequence[str]) -> tuple[Path, str]:
    """The directory of the daemon's socket and what named it: the engine's loader config
    (socket_path / socket_dir), the daemon's --socket-path / --weight-cache-socket-dir, else the
    per-user default under the temp dir."""
    config = loader_config(engine_argv)
    if isinstance(config.get("socket_path"), str):
        return Path(config["socket_path"]).parent, "engine socket_path"
    if isinstance(config.get("socket_dir"), str):
        return Path(config["socket_dir"]), "engine socket_dir"
    if (path := flag_value(daemon_argv, "--socket-path")) is not None:
        return Path(path).parent, "daemon --socket-path"
    if (path := flag_value(daemon_argv, "--weight-cache-socket-dir")) is not None:
        return Path(path), "daemon --weight-cache-socket-dir"
    return Path(tempfile.gettempdir()) / f"vllm_weight_cache_{os.getuid()}", "default"


def socket_dir_problem(path: Path) -> tuple[str | None, dict[str, Any]]:
    """Why the socket directory is unsafe (another owner, group/world access), and what was read."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"socket directory {path} cannot be read ({exc.strerror or exc})", {"path": str(path)}
    mode = stat.S_IMODE(st.st_mode)
    seen = {"path": str(path), "owner_uid": st.st_uid, "mode": f"{mode:04o}"}
    if st.st_uid != os.getuid():
        return f"socket directory {path} is owned by uid {st.st_uid}, not this user ({os.getuid()})", seen
    if mode & 0o077:
        return (
            f"socket directory {path} has mode {mode:04o}: group or others can reach the weight "
            f"cache; chmod 700 {path}",
            seen,
        )
    return None, seen


def daemon_install(
    daemon_argv: Sequence[str], env: Mapping[str, str] | None = None, install: InstallReader = read_install
) -> Install:
    """The vLLM the daemon's command runs, read as the pair check reads it (its `VAR=value` words over
    `env`, default this process's); blocking (asks its interpreter)."""
    words = daemon_words(daemon_argv)
    command = command_of(words)
    return install(command.argv or words, {**(os.environ if env is None else env), **command.assignments})


def _flags(
    engine: Mapping[str, str | bool], daemon: Mapping[str, str | bool]
) -> tuple[dict[str, dict[str, object]], list[str]]:
    pairs: dict[str, dict[str, object]] = {}
    refusals: list[str] = []
    for key, flag, default in _PAIRED:
        ours, theirs = engine.get(key, default), daemon.get(key, default)
        pairs[key] = {"engine": ours, "daemon": theirs}
        if ours != theirs:
            refusals.append(f"{flag}: engine {ours!r}, daemon {theirs!r}")
    return pairs, refusals


def _installs(engine: Install, daemon: Install) -> tuple[dict[str, dict[str, object]], list[str], list[str]]:
    """Version and platform pairs, what differs (or is unfit), and what a side does not state."""
    pairs: dict[str, dict[str, object]] = {}
    refusals: list[str] = []
    unstated: list[str] = []
    for key, ours, theirs, where in (
        ("vllm_version", engine.version, daemon.version, (engine.version_from, daemon.version_from)),
        ("platform", engine.platform, daemon.platform, (engine.platform_from, daemon.platform_from)),
    ):
        pairs[key] = {"engine": ours, "daemon": theirs, "from": {"engine": where[0], "daemon": where[1]}}
        unstated += [
            f"{key} ({side}: {w})"
            for side, v, w in (("engine", ours, where[0]), ("daemon", theirs, where[1]))
            if v is None
        ]
        if ours is not None and theirs is not None and ours != theirs:
            refusals.append(
                f"{key.replace('_', ' ')}: engine {ours}, daemon {theirs} ({where[0]}; {where[1]}): "
                "the daemon's cache key holds the vLLM version, so the engine would fall back to disk "
                "or fail; run both from the same vLLM (upgrade the daemon first and rebuild its cache)"
            )
    for side, platform in (("engine", engine.platform), ("daemon", daemon.platform)):
        if platform is not None and platform not in IPC_PLATFORMS:
            refusals.append(
                f"the {side}'s vLLM is the {platform} build: the weight cache shares CUDA IPC handles, "
                "CUDA and ROCm only (vllm preload exits with UnsupportedPlatformForIPCError); use the "
                "default --load-format and no daemon on this platform"
            )
    return pairs, refusals, unstated


def check_preload_pair(
    engine_argv: Sequence[str],
    daemon_argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    daemon_env: Mapping[str, str] | None = None,
    install: InstallReader = read_install,
    nvml: Callable[[], list[GpuDevice] | None] = read_gpus,
) -> CheckResult:
    """Refused when they disagree or the socket directory is not private; not_measured when the
    daemon's command names no --model (its flags cannot be read); passed otherwise, naming what one
    side does not state. `env` is the engine's environment, `daemon_env` the daemon's before its own
    `VAR=value` words (both default to this process's); blocking (asks each interpreter its vLLM)."""
    if not daemon_argv:
        return CheckResult(NAME, Outcome.SKIPPED, "no preload daemon configured")
    engine = serving_settings(engine_argv)
    words = daemon_words(daemon_argv)
    command = command_of(words)
    daemon = serving_settings(words)
    daemon_argv = words
    engine_env = dict(os.environ if env is None else env)
    their_env = {**(os.environ if daemon_env is None else daemon_env), **command.assignments}
    refusals: list[str] = []
    pp = str(engine.get("pipeline_parallel_size", "1"))
    if pp != "1":
        refusals.append(f"the engine runs --pipeline-parallel-size {pp}: the weight cache serves no PP")
    if engine.get("load_format") != "ipc_cache":
        refusals.append(
            f"the engine loads --load-format {engine.get('load_format', 'auto')}: it would not take its "
            "weights from the daemon; add --load-format ipc_cache (or drop the preload daemon)"
        )
    if daemon.get("load_format") == "ipc_cache":
        refusals.append("the daemon has --load-format ipc_cache: it must load the weights from disk")
    pairs: dict[str, dict[str, object]] = {}
    if "model" in daemon:
        pairs, differ = _flags(engine, daemon)
        refusals += differ
    installed, differ, unstated = _installs(
        install(engine_argv, engine_env), install(command.argv or words, their_env)
    )
    pairs.update(installed)
    refusals += differ
    ours, theirs = rank_gpus(engine_argv, engine_env, nvml), rank_gpus(command.argv or words, their_env, nvml)
    pairs["gpus"] = {
        "engine": list(ours.names) if ours.names is not None else None,
        "daemon": list(theirs.names) if theirs.names is not None else None,
        "from": {"engine": ours.named_by, "daemon": theirs.named_by},
    }
    if comparable(ours, theirs):
        if ours.names != theirs.names:
            refusals.append(
                f"GPUs: engine ranks on {','.join(ours.names or ())} ({ours.named_by}), daemon ranks on "
                f"{','.join(theirs.names or ())} ({theirs.named_by}): the daemon's sockets are named by "
                "its GPUs' UUIDs, so the engine would find none; give both the same CUDA_VISIBLE_DEVICES"
            )
    else:
        unstated.append(f"gpus (engine: {ours.named_by}; daemon: {theirs.named_by})")
    where, named_by = socket_dir(engine_argv, daemon_argv)
    problem, seen = socket_dir_problem(where)
    evidence: dict[str, Any] = {
        "pairs": pairs,
        "socket_dir": {**seen, "from": named_by},
        "not_stated": unstated,
    }
    steps = [
        Step(
            key,
            "not stated"
            if p["engine"] is None or p["daemon"] is None
            else "same"
            if p["engine"] == p["daemon"]
            else "DIFFERS",
            f"engine {shown(p['engine'])}, daemon {shown(p['daemon'])}",
        )
        for key, p in pairs.items()
    ]
    steps.append(
        Step(
            "socket dir",
            str(seen.get("mode", "?")),
            f"{where} ({named_by}), owner uid {seen.get('owner_uid')}",
        )
    )
    evidence["lines"] = step_lines(steps)
    if problem is not None:
        refusals.append(problem)
    if refusals:
        return CheckResult(
            NAME, Outcome.REFUSED, "preload daemon and engine disagree: " + "; ".join(refusals), evidence
        )
    unsaid = f"; {NOT_STATED}: {', '.join(unstated)}" if unstated else ""
    if "model" not in daemon:
        return CheckResult(
            NAME,
            Outcome.NOT_MEASURED,
            f"the daemon's command names no --model: model, revision, dtype, quantization, TP, DP and "
            f"EP not compared; socket directory {where} mode {seen['mode']}{unsaid}",
            evidence,
        )
    stated = [k for k in ("vllm_version", "platform", "gpus") if not any(u.startswith(k) for u in unstated)]
    also = f", {', '.join(stated)}" if stated else ""
    return CheckResult(
        NAME,
        Outcome.PASSED,
        f"daemon and engine agree on model, revision, dtype, quantization, TP, DP, EP{also}; "
        f"socket directory {where} mode {seen['mode']}{unsaid}",
        evidence,
    )
