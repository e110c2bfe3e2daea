"""What `--sleep-after-seconds`, `--sleep-level`, `--sleep-mode`, `--sleep-peer` and
`--sleep-last-awake` ask of idle sleep (`corral.supervisor.runbook.idle_sleep`, which does it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

MAX_PEERS = 64  # --sleep-peer, at most
MAX_AFTER_SECONDS = 7 * 24 * 3600.0  # --sleep-after-seconds, at most a week


class IdleSleepView(Protocol):
    """What `/v1/state` shows of idle sleep (`idle_sleep`)."""

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class IdleSleepSettings:
    after_seconds: float = 0.0  # 0: off
    level: int = 1
    mode: str = "wait"
    peers: tuple[str, ...] = ()  # the supervisors of the model's other engines
    last_awake: bool = False  # --sleep-last-awake: the last awake engine of a model may sleep too

    @property
    def reason(self) -> str:
        return f"idle {self.after_seconds:g} s"


MAX_PEER_URL = 2048  # characters of one --sleep-peer URL


def peer_urls(values: tuple[str, ...]) -> tuple[str, ...]:
    """The --sleep-peer URLs, checked: http(s)://host:port at most MAX_PEER_URL characters, at most
    MAX_PEERS of them; raises ValueError naming the one that is not."""
    if len(values) > MAX_PEERS:
        raise ValueError(f"{len(values)} --sleep-peer URLs: at most {MAX_PEERS}")
    checked = []
    for value in values:
        shown = value if len(value) <= 100 else value[:100] + "..."
        if len(value) > MAX_PEER_URL:
            raise ValueError(f"--sleep-peer {shown!r}: longer than {MAX_PEER_URL} characters")
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"--sleep-peer {shown!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ValueError(f"--sleep-peer {shown!r}: give a supervisor's http://host:port")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"--sleep-peer {shown!r}: no query, fragment or credentials; a token is sent")
        checked.append(value.rstrip("/"))
    return tuple(checked)
