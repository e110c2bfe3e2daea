"""Rendered objects as YAML: one file per object in a directory, or one multi-document stream. Output
is deterministic (field order as built, no timestamps), so a committed rendering can be compared with
a fresh one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.manifests import Manifest

HEADER = "# Rendered by `corral k8s render`; edit the config and render again instead of editing this file."


def secret_hint(config: CorralDeployment) -> str:
    """How to create the fleet key Secret (every pod's supervisor token is derived from it), which is
    never rendered (a value would land in Git)."""
    return (
        f"kubectl -n {config.namespace} create secret generic {config.token_secret} "
        f'--from-literal={config.token.key}="$(openssl rand -hex 32)"'
    )


def admin_secret_hint(config: CorralDeployment) -> str:
    """How to create the router's admin key Secret: /metrics and /v1/fleet answer only its key on the
    pod network (give the same key to Prometheus as its bearer token)."""
    return (
        f"kubectl -n {config.namespace} create secret generic {config.router_admin_secret} "
        f'--from-literal={config.router.admin_key.key}="$(openssl rand -hex 32)"'
    )


class _PlainDumper(yaml.SafeDumper):
    """Repeats a shared value (the pod labels are the Deployment's) instead of writing &id001 anchors."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def to_yaml(manifest: Manifest) -> str:
    return yaml.dump(manifest.obj, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False, width=100)


def document(config: CorralDeployment, manifest: Manifest) -> str:
    lines = [HEADER]
    if manifest.filename in ("engine-deployment.yaml", "prefill-deployment.yaml", "decode-deployment.yaml"):
        lines.append(f"# Needs the fleet key Secret first: {secret_hint(config)}")
    if manifest.filename == "router-deployment.yaml":
        lines.append(f"# Needs the router's admin key Secret first: {admin_secret_hint(config)}")
    return "\n".join(lines) + "\n" + to_yaml(manifest)


def stream(config: CorralDeployment, manifests: Sequence[Manifest]) -> str:
    return "---\n".join(document(config, m) for m in manifests)


def write_dir(out: Path, config: CorralDeployment, manifests: Sequence[Manifest]) -> list[Path]:
    """Write one file per object; earlier renderings' files that are no longer produced are removed
    (only files that carry the header, so nothing else in the directory is touched)."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = {m.filename for m in manifests}
    for old in sorted(out.glob("*.yaml")):
        if old.name not in wanted and old.read_text(encoding="utf-8").startswith(HEADER):
            old.unlink()
    written = []
    for m in manifests:
        path = out / m.filename
        path.write_text(document(config, m), encoding="utf-8")
        written.append(path)
    return written
