"""PRECHECK's preload pair: the weight-cache daemon's command against the engine's (no pipeline
parallelism in the engine, the daemon loads from disk, same model, revision, dtype and TP), and the
socket directory they share owned by this user with no group or world access.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.engine.flags import flag_value, serving_settings
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.explain import Step, step_lines

NAME = "preload"
_SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
# what the engine and the daemon must agree on, with vLLM's default when the flag is absent
_PAIRED: tuple[tuple[str, str, str | None], ...] = (
    ("model", "--model", None),
    ("revision", "--revision", None),
    ("dtype", "--dtype", "auto"),
    ("tensor_parallel_size", "--tensor-parallel-size", "1"),
)


def loader_config(engine_argv: Sequence[str]) -> dict[str, Any]:
    raw = serving_settings(engine_argv).get("model_loader_extra_config")
    if not isinstance(raw, str):
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


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


def daemon_words(daemon_argv: Sequence[str]) -> list[str]:
    """The daemon's command, with a `sh -c SCRIPT` wrapper read through (its words, as the shell
    would split them), so that a wrapped `exec vllm preload --model M …` is still compared."""
    if len(daemon_argv) >= 3 and Path(daemon_argv[0]).name in _SHELLS and daemon_argv[1] == "-c":
        try:
            return shlex.split(daemon_argv[2])
        except ValueError:
            return list(daemon_argv)
    return list(daemon_argv)


def check_preload_pair(engine_argv: Sequence[str], daemon_argv: Sequence[str]) -> CheckResult:
    """Refused when they disagree or the socket directory is not private; not_measured when the
    daemon's command names no --model (its flags cannot be read); passed otherwise."""
    if not daemon_argv:
        return CheckResult(NAME, Outcome.SKIPPED, "no preload daemon configured")
    engine = serving_settings(engine_argv)
    words = daemon_words(daemon_argv)
    daemon = serving_settings(words)
    daemon_argv = words
    refusals: list[str] = []
    pp = str(engine.get("pipeline_parallel_size", "1"))
    if pp != "1":
        refusals.append(f"the engine runs --pipeline-parallel-size {pp}: the weight cache serves no PP")
    if daemon.get("load_format") == "ipc_cache":
        refusals.append("the daemon has --load-format ipc_cache: it must load the weights from disk")
    pairs: dict[str, Any] = {}
    for key, flag, default in _PAIRED if "model" in daemon else ():
        ours, theirs = engine.get(key, default), daemon.get(key, default)
        pairs[key] = {"engine": ours, "daemon": theirs}
        if ours != theirs:
            refusals.append(f"{flag}: engine {ours!r}, daemon {theirs!r}")
    where, named_by = socket_dir(engine_argv, daemon_argv)
    problem, seen = socket_dir_problem(where)
    evidence: dict[str, Any] = {"pairs": pairs, "socket_dir": {**seen, "from": named_by}}
    steps = [
        Step(
            key,
            "same" if p["engine"] == p["daemon"] else "DIFFERS",
            f"engine {p['engine']}, daemon {p['daemon']}",
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
    if "model" not in daemon:
        return CheckResult(
            NAME,
            Outcome.NOT_MEASURED,
            f"the daemon's command names no --model: model, revision, dtype and TP not compared; "
            f"socket directory {where} mode {seen['mode']}",
            evidence,
        )
    return CheckResult(
        NAME,
        Outcome.PASSED,
        f"daemon and engine agree on model, revision, dtype and TP; socket directory {where} "
        f"mode {seen['mode']}",
        evidence,
    )
