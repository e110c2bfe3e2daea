"""Docs that must not contradict each other or the example they describe (issue 32): nothing tells a
reader to `pip install corral` (docs/install.md: that installs something else), and docs/kubernetes.md
says what deploy/examples/wait-for-kv-cache is: its replica count, and that its render warns of
nothing."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from corral.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "wait-for-kv-cache"
WORDS = {1: "one replica", 2: "two replicas", 3: "three replicas"}
PIP_CORRAL = re.compile(r"pip install corral(?![\w./\[-])")  # the PyPI name, not a wheel's path


def _texts() -> list[Path]:
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "deploy").rglob("*")]
    return [p for p in pages if p.is_file() and p.suffix in (".md", ".yaml", ".yml", ".Dockerfile")]


def test_only_install_md_mentions_pip_install_corral_and_only_to_say_it_is_not_this_project() -> None:
    telling = []
    for page in _texts():
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if PIP_CORRAL.search(line) and "not" not in line and "something else" not in line:
                telling.append(f"{page.relative_to(ROOT)}:{n}: {line.strip()}")
    assert telling == [], telling


def test_kubernetes_md_says_what_the_wait_for_kv_cache_example_does(tmp_path: Path) -> None:
    replicas = yaml.safe_load((EXAMPLE / "corral.yaml").read_text(encoding="utf-8"))["replicas"]
    doc = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    said = " ".join(doc.partition("deploy/examples/wait-for-kv-cache/")[2].partition("\n- ")[0].split())
    assert f"It has {WORDS[replicas]}" in said, said
    result = CliRunner().invoke(
        main, ["k8s", "render", "--config", str(EXAMPLE / "corral.yaml"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    warns = "warning:" in result.stderr
    assert ("prints no warning" in said) == (not warns), (said, result.stderr)
