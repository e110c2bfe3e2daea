"""PRECHECK's environment: the engine's cache directories writable (as vLLM and huggingface_hub
resolve them from the engine's environment), an HF token present when the model needs one (never
shown), free disk for a download, every file of a local model directory readable, and an optional
read-throughput probe of the largest weight file. Blocking file work: run it off the event loop.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.engine.flags import flag_value, serving_settings
from corral.engine.revisions import is_pinned
from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.explain import Step, gib, step_lines
from corral.supervisor.precheck.identity import EngineKind, ModelKind

NAME = "environment"
MIB = 1024 * 1024
GIB = 1024 * MIB
TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_UNREADABLE_SHOWN = 5


@dataclass(frozen=True)
class EnvironmentSettings:
    require_hf_token: bool = False  # the model is gated: a token must be there (the hub is not asked)
    download_bytes: int | None = None  # the declared size of a hub model, for the free-disk check
    probe_read_mib: int = 0  # read this much of the largest weight file and report MiB/s (0: no probe)


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or os.path.expanduser("~"))


def cache_dirs(argv: Sequence[str], env: Mapping[str, str], engine: str, model_kind: str) -> dict[str, Path]:
    """The directories the engine writes, by what names them: the hub cache when a hub model is
    downloaded (`--download-dir`, else HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME or
    ~/.cache /huggingface/hub) and vLLM's own cache (VLLM_CACHE_ROOT, else XDG_CACHE_HOME or
    ~/.cache /vllm) for a real vLLM. The simulator writes neither."""
    xdg = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else _home(env) / ".cache"
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else xdg / "huggingface"
    dirs: dict[str, Path] = {}
    if model_kind == ModelKind.HUB:
        download_dir = flag_value(argv, "--download-dir")
        if download_dir:
            dirs["--download-dir"] = Path(download_dir)
        elif env.get("HF_HUB_CACHE"):
            dirs["HF_HUB_CACHE"] = Path(env["HF_HUB_CACHE"])
        else:
            dirs["HF_HOME/hub" if env.get("HF_HOME") else "hub cache"] = hf_home / "hub"
    if engine != EngineKind.SIM:
        root = env.get("VLLM_CACHE_ROOT")
        dirs["VLLM_CACHE_ROOT" if root else "vLLM cache"] = Path(root) if root else xdg / "vllm"
    return dirs


def writable_problem(path: Path) -> str | None:
    """Why the engine could not write under `path` (created on first use: its nearest existing
    parent must take it), or None. Tries a real file, as permissions alone say nothing under root."""
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            return f"{path}: no existing parent"
        existing = existing.parent
    if not existing.is_dir():
        return f"{path}: {existing} is not a directory"
    probe = existing / f".corral-precheck-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"{path}: cannot write in {existing} ({exc.strerror or exc})"
    return None


def token_source(env: Mapping[str, str]) -> str | None:
    """Where an HF token would come from (a variable's name or the token file's path), never the
    token: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, else the file HF_TOKEN_PATH or HF_HOME/token."""
    for var in TOKEN_VARS:
        if env.get(var, "").strip():
            return f"${var}"
    xdg = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else _home(env) / ".cache"
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else xdg / "huggingface"
    path = Path(env["HF_TOKEN_PATH"]) if env.get("HF_TOKEN_PATH") else hf_home / "token"
    try:
        if path.read_bytes().strip():
            return str(path)
    except OSError:
        return None
    return None


def cached_snapshot(hub: Path, model: str, revision: str | None) -> Path | None:
    """The snapshot of `model` at `revision` already in the hub cache (huggingface_hub's layout:
    models--OWNER--NAME/snapshots/COMMIT, a branch resolved through refs/BRANCH), or None."""
    repo = hub / ("models--" + model.replace("/", "--"))
    ref = revision or "main"
    commit = ref if is_pinned(ref) else None
    if commit is None:
        try:
            commit = (repo / "refs" / ref).read_text().strip()
        except OSError:
            return None
    snapshot = repo / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def unreadable_files(model_dir: Path) -> tuple[int, list[str]]:
    """How many files the directory holds and those that cannot be opened for reading."""
    count = 0
    bad: list[str] = []
    for root, _dirs, files in os.walk(model_dir):
        for name in files:
            path = Path(root, name)
            count += 1
            try:
                with path.open("rb") as fh:
                    fh.read(1)
            except OSError as exc:
                bad.append(f"{path.relative_to(model_dir)} ({exc.strerror or exc})")
    return count, bad


def _data_bytes(fd: int, start: int, end: int) -> int:
    """Bytes of [start, end) that hold data rather than holes (SEEK_DATA/SEEK_HOLE where the
    filesystem has them; else all of it)."""
    if not hasattr(os, "SEEK_DATA"):
        return end - start
    total = 0
    offset = start
    while offset < end:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past offset
            break
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        total += hole - data
        offset = hole
    return total


def probe_read(model_dir: Path, mib: int) -> dict[str, Any]:
    """Read up to `mib` MiB of the largest weight file and time it. A sparse file's holes come from
    no disk: the evidence says how much of the range was data, and that the figure is then not the
    disk's."""
    weights = sorted(model_dir.rglob("*.safetensors"))
    weights = weights or sorted(p for p in model_dir.rglob("*") if p.is_file())
    if not weights:
        return {"file": None, "note": "no file to read"}
    largest = max(weights, key=lambda p: p.stat().st_size)
    stat = largest.stat()
    want = min(mib * MIB, stat.st_size)
    fd = os.open(largest, os.O_RDONLY)
    try:
        data = _data_bytes(fd, 0, want)
        os.lseek(fd, 0, os.SEEK_SET)  # SEEK_DATA/SEEK_HOLE moved the offset
        started = time.perf_counter()
        done = 0
        while done < want:
            chunk = os.read(fd, min(8 * MIB, want - done))
            if not chunk:
                break
            done += len(chunk)
        seconds = time.perf_counter() - started
    finally:
        os.close(fd)
    sparse = stat.st_blocks * 512 < stat.st_size
    result: dict[str, Any] = {
        "file": str(largest),
        "read_mib": round(done / MIB, 1),
        "seconds": round(seconds, 4),
        "mib_per_s": round(done / MIB / seconds, 1) if seconds > 0 else None,
        "sparse": sparse,
        "data_mib_in_range": round(data / MIB, 1),
    }
    if data < done:
        result["note"] = (
            f"{(done - data) / MIB:.1f} of {done / MIB:.1f} MiB read were holes of a sparse file, "
            "served from no disk: this figure is not the disk's throughput"
        )
    return result


def _lines(evidence: dict[str, Any]) -> list[str]:
    steps = [
        Step(name, "writable" if seen["writable"] else "NOT writable", seen["path"])
        for name, seen in evidence["cache_dirs"].items()
    ]
    token = evidence["hf_token"]
    steps.append(
        Step(
            "HF token",
            "present" if token["present"] else "absent",
            token.get("source") or ("required: --require-hf-token" if token["required"] else "not required"),
        )
    )
    if (download := evidence.get("download")) is not None and download["cached_snapshot"]:
        steps.append(Step("hub cache", "cached", f"{download['cached_snapshot']}: no download"))
    elif download is not None:
        free, need = download["free_bytes"], download["declared_bytes"]
        steps.append(
            Step(
                "free disk",
                gib(free) if free is not None else "?",
                f"under {download['dir']}; the download needs " + (gib(need) if need is not None else "?"),
            )
        )
    if (model_dir := evidence.get("model_dir")) is not None:
        bad = len(model_dir["unreadable"])
        steps.append(Step("model files", f"{model_dir['files'] - bad} readable", model_dir["path"]))
    if (probe := evidence.get("read_probe")) is not None and probe.get("file"):
        sparse = " (sparse file: not the disk's figure)" if probe.get("note") else ""
        steps.append(
            Step(
                "read probe",
                f"{probe['mib_per_s']} MiB/s",
                f"{probe['read_mib']} MiB of {probe['file']}{sparse}",
            )
        )
    return step_lines(steps)


def check_environment(
    argv: Sequence[str],
    env: Mapping[str, str],
    engine: str,
    model_kind: str,
    settings: EnvironmentSettings,
) -> CheckResult:
    """One result over every part; refused when any part is, naming each. Blocking."""
    evidence: dict[str, Any] = {}
    refusals: list[str] = []
    notes: list[str] = []
    dirs = cache_dirs(argv, env, engine, model_kind)
    problems = {name: writable_problem(path) for name, path in dirs.items()}
    evidence["cache_dirs"] = {
        name: {"path": str(path), "writable": problems[name] is None} for name, path in dirs.items()
    }
    refusals += [f"cache directory {name} not writable: {p}" for name, p in problems.items() if p]

    source = token_source(env)
    evidence["hf_token"] = {"required": settings.require_hf_token, "present": source is not None}
    if source is not None:
        evidence["hf_token"]["source"] = source
    if settings.require_hf_token and source is None:
        refusals.append(
            "the model is declared gated (--require-hf-token) and no HF token is set: set HF_TOKEN "
            "(or HUGGING_FACE_HUB_TOKEN, or the token file $HF_HOME/token) in the engine's environment"
        )

    command = serving_settings(argv)
    model = command.get("model")
    if model_kind == ModelKind.HUB and isinstance(model, str):
        hub = next(iter(dirs.values()))
        existing = hub
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        free = shutil.disk_usage(existing).free if existing.exists() else None
        need = settings.download_bytes
        revision = command.get("revision")
        cached = cached_snapshot(hub, model, revision if isinstance(revision, str) else None)
        evidence["download"] = {
            "dir": str(hub),
            "free_bytes": free,
            "declared_bytes": need,
            "cached_snapshot": str(cached) if cached else None,
        }
        if cached is not None:
            notes.append(f"the revision is in the hub cache ({cached.name[:12]}): no download")
        elif need is None or free is None:
            notes.append("free disk for the download not measured (declare the model's size)")
        elif free < need:
            refusals.append(
                f"free disk under {hub} is {free / GIB:.1f} GiB, the download needs "
                f"{need / GIB:.1f} GiB ({(need - free) / GIB:.1f} GiB short)"
            )
    elif model_kind == ModelKind.LOCAL_DIR and isinstance(model, str):
        count, bad = unreadable_files(Path(model))
        evidence["model_dir"] = {"path": model, "files": count, "unreadable": bad[:_UNREADABLE_SHOWN]}
        if bad:
            more = f" and {len(bad) - _UNREADABLE_SHOWN} more" if len(bad) > _UNREADABLE_SHOWN else ""
            refusals.append(
                f"model directory {model}: {len(bad)} of {count} files unreadable: "
                f"{', '.join(bad[:_UNREADABLE_SHOWN])}{more}"
            )
        if settings.probe_read_mib > 0:
            evidence["read_probe"] = probe_read(Path(model), settings.probe_read_mib)
    if settings.probe_read_mib > 0 and "read_probe" not in evidence:
        evidence["read_probe"] = {"note": f"no local model directory to read ({model_kind} model)"}

    evidence["lines"] = _lines(evidence)
    if refusals:
        return CheckResult(NAME, Outcome.REFUSED, "; ".join(refusals), evidence)
    parts = [f"{len(dirs)} cache dirs writable" if dirs else "no cache directory written (simulated model)"]
    if settings.require_hf_token:
        parts.append("HF token present")
    if "model_dir" in evidence:
        parts.append(f"{evidence['model_dir']['files']} model files readable")
    probe = evidence.get("read_probe", {})
    if probe.get("mib_per_s") is not None:
        parts.append(f"read {probe['mib_per_s']} MiB/s" + (" (sparse)" if probe.get("sparse") else ""))
    return CheckResult(NAME, Outcome.PASSED, ", ".join(parts + notes), evidence)
