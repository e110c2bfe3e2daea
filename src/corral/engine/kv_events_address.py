"""Where a subscriber reaches an engine's KV-cache events: the publisher's and replay socket's ZMQ
addresses with a bind's wildcard host (`tcp://*:5557`, `tcp://0.0.0.0:5557`) replaced by the engine's
host, read from the engine's `--kv-events-config` or written as `PUB[,REPLAY]` (a state line's
`kv_events`, a backends file's `kv_events=` marker, a pod's `corral.dev/kv-events` annotation)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from urllib.parse import urlsplit

from corral.engine.kv_events import parse_kv_events_config

KV_EVENTS_FLAG = "--kv-events-config"
_WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class KvEventsAddress:
    """An engine's KV events as a subscriber connects to them; `replay` None when it has no replay socket."""

    endpoint: str
    replay: str | None = None

    def to_text(self) -> str:
        return self.endpoint if self.replay is None else f"{self.endpoint},{self.replay}"


def _connectable(address: str, host: str, what: str) -> str:
    if not address.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(
            f"{what} {address!r} is not a ZMQ address; write tcp://HOST:PORT (tcp://*:PORT binds on the "
            "engine's host)"
        )
    if not address.startswith("tcp://"):
        return address
    rest = address.removeprefix("tcp://")
    bind_host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit():
        raise ValueError(f"{what} {address!r} has no port; write tcp://HOST:PORT, e.g. tcp://*:5557")
    if bind_host in _WILDCARDS:
        bind_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{bind_host}:{port}"


def parse_address(text: str, host: str) -> KvEventsAddress:
    """`PUB[,REPLAY]` with wildcard hosts replaced by `host`; a bad address is a ValueError saying why."""
    parts = [p.strip() for p in text.split(",")]
    if not parts[0] or len(parts) > 2 or (len(parts) == 2 and not parts[1]):
        raise ValueError(
            f"KV events address {text!r}: write the publisher's ZMQ address and, optionally, the replay "
            "socket's after a comma, e.g. tcp://*:5557,tcp://*:5558"
        )
    endpoint = _connectable(parts[0], host, "KV events publisher")
    replay = _connectable(parts[1], host, "KV events replay socket") if len(parts) == 2 else None
    return KvEventsAddress(endpoint, replay)


def kv_events_config_text(argv: Sequence[str]) -> str | None:
    """The last `--kv-events-config` value in an engine's command (`--flag value` or `--flag=value`)."""
    found: str | None = None
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == KV_EVENTS_FLAG and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(KV_EVENTS_FLAG + "="):
            found = arg.partition("=")[2]
    return found


def publisher_binds(endpoint: str) -> bool:
    """Whether vLLM binds its publisher at `endpoint` (a wildcard host, ipc, inproc) rather than
    connecting out to a subscriber that binds there (any other tcp address)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address_from_argv(argv: Sequence[str], engine_url: str) -> KvEventsAddress | None:
    """Where the engine that `argv` starts publishes its KV events, as seen from elsewhere (its wildcard
    bind becomes `engine_url`'s host); None when it publishes none, when its publisher connects out to a
    subscriber of its own (a tcp address without a wildcard host) instead of binding, or when the config
    cannot be read (the engine itself refuses a bad one). An engine reached on loopback (a pod's engine
    behind its admission gate) keeps its wildcard: 127.0.0.1 would name each subscriber's own host, and
    the subscriber maps the wildcard to the host it reaches the engine's pod at."""
    text = kv_events_config_text(argv)
    if text is None:
        return None
    try:
        config = parse_kv_events_config(text)
    except ValueError:
        return None
    if not config.publishing or not publisher_binds(config.endpoint):
        return None
    host = urlsplit(engine_url).hostname or "127.0.0.1"
    if _loopback(host):
        return KvEventsAddress(config.endpoint, config.replay_endpoint)
    try:
        endpoint = _connectable(config.endpoint, host, "KV events publisher")
        replay = config.replay_endpoint
        return KvEventsAddress(
            endpoint, _connectable(replay, host, "KV events replay socket") if replay else None
        )
    except ValueError:
        return None
