"""What a dependency gate's spec names (`--wait-for unix:/path`, `tcp:host:port`, `http(s)://…`,
`file:/path`): the syntax the supervisor waits on (`corral.supervisor.checks.dependencies`) and
`corral k8s render` checks in a config, parsed in one place."""

from __future__ import annotations

from dataclasses import dataclass

_SCHEMES = ("unix:", "tcp:", "http://", "https://", "file:")


class GateSpecError(ValueError):
    """A `--wait-for` value that names no known kind of dependency."""


@dataclass(frozen=True)
class GateSpec:
    """One declared dependency: its spec as written, its kind (unix, tcp, http, file), its target (a
    path, a host or a URL) and, for tcp, its port."""

    spec: str
    kind: str
    target: str
    port: int = 0


def parse_gate_spec(spec: str) -> GateSpec:
    """`unix:/path`, `tcp:host:port`, `http(s)://…`, `file:/path`; anything else is a GateSpecError."""
    if spec.startswith(("http://", "https://")):
        return GateSpec(spec, "http", spec)
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("unix", "tcp", "file"):
        raise GateSpecError(f"--wait-for {spec!r}: unknown dependency kind; use one of {', '.join(_SCHEMES)}")
    if not rest:
        raise GateSpecError(f"--wait-for {spec!r}: nothing after {kind}:")
    if kind == "tcp":
        host, _, port_text = rest.rpartition(":")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise GateSpecError(f"--wait-for {spec!r}: expected tcp:HOST:PORT")
        return GateSpec(spec, "tcp", host.strip("[]"), int(port_text))
    return GateSpec(spec, kind, rest)
