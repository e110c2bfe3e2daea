"""Bundle identity: what changes the fingerprint and what does not."""

from __future__ import annotations

from pathlib import Path

from corral.engine.evidence import classify
from corral.supervisor.checks.bundle import bundle_from, command_parts, model_files_digest

BASE = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--port", "8000"]
MODELS = [{"id": "m", "parent": None}, {"id": "ad", "parent": "m"}]


def test_command_parts_read_both_flag_forms_and_vllm_serve() -> None:
    parts = command_parts(
        ["vllm", "serve", "org/m", "--dtype=bfloat16", "-tp", "2", "--enable-expert-parallel"]
    )
    assert parts == {
        "model": "org/m",
        "dtype": "bfloat16",
        "tensor_parallel_size": "2",
        "expert_parallel": True,
    }


def test_ports_and_adapters_do_not_change_the_fingerprint() -> None:
    a = bundle_from(BASE, "0.33.0", MODELS)
    b = bundle_from([*BASE[:-1], "9000"], "0.33.0", MODELS[:1])
    assert a.fingerprint == b.fingerprint
    assert a.adapters == ["ad"] and b.adapters == []


def test_revision_version_and_template_change_the_fingerprint(tmp_path: Path) -> None:
    base = bundle_from(BASE, "0.33.0", MODELS).fingerprint
    assert bundle_from([*BASE, "--revision", "r2"], "0.33.0", MODELS).fingerprint != base
    assert bundle_from(BASE, "0.34.0", MODELS).fingerprint != base
    template = tmp_path / "t.jinja"
    template.write_text("{{ a }}")
    one = bundle_from([*BASE, "--chat-template", str(template)], "0.33.0", MODELS).fingerprint
    template.write_text("{{ b }}")
    assert bundle_from([*BASE, "--chat-template", str(template)], "0.33.0", MODELS).fingerprint != one


def test_a_local_model_directory_is_hashed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 100)
    first = model_files_digest(tmp_path)
    assert first["files"] == 2
    argv = ["vllm", "serve", str(tmp_path)]
    before = bundle_from(argv, "0.33.0", []).fingerprint
    (tmp_path / "config.json").write_text('{"a": 1}')
    assert model_files_digest(tmp_path)["digest"] != first["digest"]
    assert bundle_from(argv, "0.33.0", []).fingerprint != before


def test_evidence_lines_are_classified() -> None:
    assert classify("Weight cache unusable (x); falling back to disk loading") == "fallback"
    assert classify("WeightCacheKey mismatch on fields: ['revision']") == "fingerprint"
    assert classify("torch.OutOfMemoryError: CUDA out of memory") == "oom"
    assert classify("INFO Loading weights took 1.0 s") is None
