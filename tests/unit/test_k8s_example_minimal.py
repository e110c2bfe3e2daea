"""The minimal Kubernetes example (deploy/examples/minimal): its committed rendering equals a fresh one,
and every object validates against the Kubernetes schemas (that it renders with no warning is in
test_k8s_examples.py, for every example)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from corral.k8s.render.budgets import derive
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.config_reading import parse_config
from corral.k8s.render.manifests import render
from corral.k8s.render.output import document

KUBERNETES = "1.30.0"
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "minimal"
REGENERATE = (
    "corral k8s render --config deploy/examples/minimal/corral.yaml --out deploy/examples/minimal/rendered"
)


def _config() -> CorralDeployment:
    return parse_config(yaml.safe_load((EXAMPLE / "corral.yaml").read_text(encoding="utf-8")))


def test_committed_minimal_rendering_is_current() -> None:
    config = _config()
    manifests = render(config, derive(config))
    committed = {p.name: p.read_text(encoding="utf-8") for p in sorted((EXAMPLE / "rendered").glob("*.yaml"))}
    assert sorted(committed) == sorted(m.filename for m in manifests), f"stale: run `{REGENERATE}`"
    for m in manifests:
        assert committed[m.filename] == document(config, m), f"{m.filename} is stale: run `{REGENERATE}`"


def test_committed_minimal_rendering_validates() -> None:
    paths = sorted((EXAMPLE / "rendered").glob("*.yaml"))
    assert paths
    for path in paths:
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
