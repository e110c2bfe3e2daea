"""What each engine likely holds in its prefix cache, as this router knows it: the prefix keys it has sent
to each endpoint, newest last, at most `DEFAULT_KEYS_PER_ENDPOINT` per endpoint (least recently sent
forgotten first), so the prefix scorer can prefer an engine that holds a prompt's blocks over the ring
home. An endpoint's keys are forgotten when its engine's prefix cache was emptied (its supervisor's
`prefix_epoch` changed: sleep level >= 1, reload, a new engine process), when it is replaced by a new
endpoint at the same address, or when it leaves membership.

`PrefixHolders` is the one question the scorer asks; a KV-event index (issue 17) answers it from the
engines' own block events instead, without the scorer changing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from corral.router.membership.endpoint import Endpoint

log = logging.getLogger("corral.router.prefix_memory")

# 4096 keys of 8 bytes (plus the dict's overhead, ~100 bytes a key): about 0.4 MB per endpoint. A key
# stands for up to `key_blocks` prompt blocks, so this is more prefixes than an engine's cache holds.
DEFAULT_KEYS_PER_ENDPOINT = 4096


class PrefixHolders(Protocol):
    """Which endpoints likely hold a prompt's leading blocks, and learning from each pick."""

    def holding(self, key: int, pool: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints of `pool` that likely cache `key`, in `pool`'s order."""
        ...

    def sent(self, key: int, endpoint: Endpoint) -> None:
        """A request with `key` was sent to `endpoint`: it will cache the prefix."""
        ...


def _epoch(endpoint: Endpoint) -> str | None:
    view = endpoint.supervisor
    return view.prefix_epoch if view is not None else None


class _Keys:
    """One endpoint's keys, valid for one endpoint object at one prefix epoch."""

    __slots__ = ("endpoint", "epoch", "keys")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.epoch = _epoch(endpoint)
        self.keys: OrderedDict[int, None] = OrderedDict()


class PrefixMemory:
    """Bounded per-endpoint LRU sets of prefix keys; O(1) per key and endpoint."""

    def __init__(self, keys_per_endpoint: int = DEFAULT_KEYS_PER_ENDPOINT) -> None:
        if keys_per_endpoint < 1:
            raise ValueError(f"keys_per_endpoint {keys_per_endpoint}: must be at least 1")
        self.keys_per_endpoint = keys_per_endpoint
        self._by_url: dict[str, _Keys] = {}
        self.forgotten = 0  # endpoints' key sets dropped (epoch change, replaced, left)

    def _current(self, endpoint: Endpoint) -> _Keys | None:
        """The endpoint's keys, dropped first when they belong to an earlier engine or prefix epoch."""
        entry = self._by_url.get(endpoint.url)
        if entry is None:
            return None
        if entry.endpoint is endpoint and entry.epoch == _epoch(endpoint):
            return entry
        why = (
            f"prefix cache epoch {entry.epoch} -> {_epoch(endpoint)}"
            if entry.endpoint is endpoint
            else "a new endpoint at this address"
        )
        self._drop(endpoint.url, why)
        return None

    def _drop(self, url: str, why: str) -> None:
        entry = self._by_url.pop(url, None)
        if entry is not None:
            self.forgotten += 1
            log.info("forgot %d prefix keys of %s: %s", len(entry.keys), url, why)

    def holding(self, key: int, pool: Sequence[Endpoint]) -> list[Endpoint]:
        held = []
        for endpoint in pool:
            entry = self._current(endpoint)
            if entry is not None and key in entry.keys:
                held.append(endpoint)
        return held

    def sent(self, key: int, endpoint: Endpoint) -> None:
        entry = self._current(endpoint)
        if entry is None:
            entry = self._by_url[endpoint.url] = _Keys(endpoint)
        keys = entry.keys
        keys[key] = None
        keys.move_to_end(key)
        if len(keys) > self.keys_per_endpoint:
            keys.popitem(last=False)

    def forget(self, url: str, why: str) -> None:
        """Drop an endpoint's keys now (it left membership)."""
        self._drop(url, why)

    def keys_of(self, endpoint: Endpoint) -> int:
        """How many keys the router holds for `endpoint` (0 once they no longer apply)."""
        entry = self._current(endpoint)
        return 0 if entry is None else len(entry.keys)

    def to_json(self, endpoint: Endpoint) -> dict[str, Any]:
        entry = self._current(endpoint)
        return {
            "keys": 0 if entry is None else len(entry.keys),
            "capacity": self.keys_per_endpoint,
            "prefix_epoch": None if entry is None else entry.epoch,
        }
