"""PRECHECK's environment and preload pair: cache directories must take a file, a gated model needs a
token (which never appears in the reason or the evidence), model files must open, a read probe says
when it read holes; the preload daemon must match the engine and its socket directory be private."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import orjson

from corral.supervisor.precheck.check import CheckResult, Outcome
from corral.supervisor.precheck.environment import EnvironmentSettings, check_environment
from corral.supervisor.precheck.identity import EngineKind, ModelKind
from corral.supervisor.precheck.preload_pair import check_preload_pair
from tests.support.model_dirs import GIB, make_model_dir

TOKEN = "hf_SECRETsecretSECRET123"


def environment(
    tmp_path: Path,
    argv: tuple[str, ...] = ("vllm", "serve", "org/m"),
    kind: str = ModelKind.HUB,
    settings: EnvironmentSettings | None = None,
    **env: str,
) -> CheckResult:
    base = {"HOME": str(tmp_path / "home")}
    return check_environment(argv, {**base, **env}, EngineKind.VLLM, kind, settings or EnvironmentSettings())


def test_writable_caches_pass_and_are_shown(tmp_path: Path) -> None:
    result = environment(tmp_path, HF_HOME=str(tmp_path / "hf"))
    assert result.outcome is Outcome.PASSED, result.reason
    dirs = result.evidence["cache_dirs"]
    assert dirs["HF_HOME/hub"] == {"path": str(tmp_path / "hf" / "hub"), "writable": True}
    assert dirs["vLLM cache"]["path"] == str(tmp_path / "home" / ".cache" / "vllm")


def test_an_unwritable_cache_dir_is_refused_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # a path under a regular file can never be created (root or not)
    result = environment(tmp_path, VLLM_CACHE_ROOT=str(blocker / "vllm"))
    assert result.outcome is Outcome.REFUSED
    assert "VLLM_CACHE_ROOT" in result.reason and str(blocker) in result.reason


def test_the_simulator_needs_no_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = check_environment(
        (sys.executable, "-m", "corral", "sim", "--model", "m"),
        {"VLLM_CACHE_ROOT": str(blocker / "x"), "HOME": str(blocker)},
        EngineKind.SIM,
        ModelKind.SIMULATED,
        EnvironmentSettings(),
    )
    assert result.outcome is Outcome.PASSED, result.reason
    assert result.evidence["cache_dirs"] == {}


def test_a_gated_model_without_a_token_is_refused(tmp_path: Path) -> None:
    result = environment(tmp_path, settings=EnvironmentSettings(require_hf_token=True))
    assert result.outcome is Outcome.REFUSED
    assert "HF_TOKEN" in result.reason and "--require-hf-token" in result.reason
    assert result.evidence["hf_token"] == {"required": True, "present": False}


def test_a_token_passes_and_never_appears(tmp_path: Path) -> None:
    for env in ({"HF_TOKEN": TOKEN}, {"HUGGING_FACE_HUB_TOKEN": TOKEN}):
        result = environment(tmp_path, settings=EnvironmentSettings(require_hf_token=True), **env)
        assert result.outcome is Outcome.PASSED, result.reason
        shown = orjson.dumps(result.to_json()).decode()
        assert TOKEN not in shown and TOKEN[:6] not in shown
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text(TOKEN + "\n")
    result = environment(
        tmp_path, settings=EnvironmentSettings(require_hf_token=True), HF_HOME=str(tmp_path / "hf")
    )
    assert result.outcome is Outcome.PASSED
    assert result.evidence["hf_token"]["source"] == str(tmp_path / "hf" / "token")
    assert TOKEN[:6] not in orjson.dumps(result.to_json()).decode()


def test_free_disk_for_the_download(tmp_path: Path) -> None:
    huge = EnvironmentSettings(download_bytes=1 << 60)
    result = environment(tmp_path, settings=huge, HF_HUB_CACHE=str(tmp_path / "hub"))
    assert result.outcome is Outcome.REFUSED
    assert "the download needs" in result.reason and "GiB short" in result.reason
    small = environment(tmp_path, settings=EnvironmentSettings(download_bytes=1024))
    assert small.outcome is Outcome.PASSED
    unknown = environment(tmp_path)
    assert "not measured" in unknown.reason


def test_an_unreadable_model_file_is_refused(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=1 << 20)
    argv = ("vllm", "serve", str(model))
    assert environment(tmp_path, argv, ModelKind.LOCAL_DIR).outcome is Outcome.PASSED
    os.symlink(tmp_path / "gone", model / "tokenizer.json")  # a file that does not open
    result = environment(tmp_path, argv, ModelKind.LOCAL_DIR)
    assert result.outcome is Outcome.REFUSED
    assert "tokenizer.json" in result.reason and "1 of 4 files unreadable" in result.reason


def test_the_read_probe_says_a_sparse_file_read_no_disk(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m", weights_bytes=2 * GIB)
    settings = EnvironmentSettings(probe_read_mib=16)
    result = environment(tmp_path, ("vllm", "serve", str(model)), ModelKind.LOCAL_DIR, settings)
    probe = result.evidence["read_probe"]
    assert probe["file"].endswith("model.safetensors") and probe["read_mib"] == 16.0
    assert probe["sparse"] is True and probe["data_mib_in_range"] < 1
    assert "not the disk's throughput" in probe["note"]
    dense = tmp_path / "d"
    dense.mkdir()
    (dense / "model.safetensors").write_bytes(os.urandom(2 << 20))
    probe = environment(tmp_path, ("vllm", "serve", str(dense)), ModelKind.LOCAL_DIR, settings).evidence[
        "read_probe"
    ]
    assert probe["read_mib"] == 2.0 and probe["sparse"] is False and "note" not in probe


# -- the preload pair --------------------------------------------------------------------------------


def private_dir(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "sock"
    path.mkdir(exist_ok=True)
    path.chmod(mode)
    return path


def engine(sock: Path, *args: str) -> tuple[str, ...]:
    config = json.dumps({"socket_dir": str(sock)})
    return (
        "vllm",
        "serve",
        "org/m",
        "--load-format",
        "ipc_cache",
        "--model-loader-extra-config",
        config,
        *args,
    )


def test_no_daemon_is_skipped() -> None:
    assert check_preload_pair(("vllm", "serve", "m"), ()).outcome is Outcome.SKIPPED


def test_a_matching_pair_with_a_private_socket_dir_passes(tmp_path: Path) -> None:
    sock = private_dir(tmp_path, 0o700)
    result = check_preload_pair(engine(sock, "-tp", "2"), ("vllm", "preload", "--model", "org/m", "-tp", "2"))
    assert result.outcome is Outcome.PASSED, result.reason
    assert result.evidence["socket_dir"]["mode"] == "0700"
    assert result.evidence["socket_dir"]["from"] == "engine socket_dir"


def test_a_socket_dir_others_can_reach_is_refused(tmp_path: Path) -> None:
    sock = private_dir(tmp_path, 0o755)
    result = check_preload_pair(engine(sock), ("vllm", "preload", "--model", "org/m"))
    assert result.outcome is Outcome.REFUSED
    assert "mode 0755" in result.reason and "chmod 700" in result.reason


def test_a_daemon_with_another_tp_model_or_load_format_is_refused(tmp_path: Path) -> None:
    sock = private_dir(tmp_path, 0o700)
    result = check_preload_pair(engine(sock, "-tp", "2"), ("vllm", "preload", "--model", "org/m"))
    assert result.outcome is Outcome.REFUSED
    assert "--tensor-parallel-size: engine '2', daemon '1'" in result.reason
    other = check_preload_pair(
        engine(sock), ("vllm", "preload", "--model", "org/other", "--load-format", "ipc_cache")
    )
    assert "--model: engine 'org/m', daemon 'org/other'" in other.reason
    assert "must load the weights from disk" in other.reason


def test_pipeline_parallelism_in_the_engine_is_refused(tmp_path: Path) -> None:
    sock = private_dir(tmp_path, 0o700)
    result = check_preload_pair(engine(sock, "-pp", "2"), ("vllm", "preload", "--model", "org/m"))
    assert result.outcome is Outcome.REFUSED and "--pipeline-parallel-size 2" in result.reason


def test_the_socket_dir_from_the_daemon_flags(tmp_path: Path) -> None:
    sock = private_dir(tmp_path, 0o700)
    daemon = ("corral", "sim", "preload", "--model", "m", "--socket-path", str(sock / "w.sock"))
    result = check_preload_pair(("corral", "sim", "--model", "m", "--load-format", "ipc_cache"), daemon)
    assert result.outcome is Outcome.PASSED, result.reason
    assert result.evidence["socket_dir"]["from"] == "daemon --socket-path"


def test_a_wrapped_daemon_is_read_through_and_an_unreadable_one_not_measured(tmp_path: Path) -> None:
    sock = private_dir(tmp_path, 0o700)
    wrapped = ("sh", "-c", "touch /tmp/x; exec vllm preload --model org/m -tp 2")
    result = check_preload_pair(engine(sock), wrapped)
    assert result.outcome is Outcome.REFUSED and "daemon '2'" in result.reason
    opaque = check_preload_pair(engine(sock), ("/opt/start-weight-cache.sh",))
    assert opaque.outcome is Outcome.NOT_MEASURED and "names no --model" in opaque.reason


def test_a_revision_already_in_the_hub_cache_needs_no_download(tmp_path: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    hub = tmp_path / "hub"
    (hub / "models--org--m" / "snapshots" / commit).mkdir(parents=True)
    (hub / "models--org--m" / "refs").mkdir()
    (hub / "models--org--m" / "refs" / "main").write_text(commit)
    huge = EnvironmentSettings(download_bytes=1 << 60)
    for argv in (("vllm", "serve", "org/m", "--revision", commit), ("vllm", "serve", "org/m")):
        result = environment(tmp_path, argv, settings=huge, HF_HUB_CACHE=str(hub))
        assert result.outcome is Outcome.PASSED, result.reason
        assert "in the hub cache" in result.reason and result.evidence["download"]["cached_snapshot"]
    other = environment(
        tmp_path, ("vllm", "serve", "org/m", "--revision", "f" * 40), settings=huge, HF_HUB_CACHE=str(hub)
    )
    assert other.outcome is Outcome.REFUSED and "the download needs" in other.reason
