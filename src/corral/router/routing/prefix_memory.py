"""What each engine likely holds in its prefix cache, as this router knows it: the prefix keys it has sent
to each endpoint, newest last, at most `DEFAULT_KEYS_PER_ENDPOINT` per endpoint (least recently sent
forgotten first), so the prefix scorer can prefer an engine that holds a prompt's blocks over the ring
home. An endpoint's keys are forgotten when its engine's prefix cache was emptied (its supervisor's
`prefix_epoch` changed: sleep level >= 1, reload, a new engine process), when it is replaced by a new
endpoint at the same address, or when it leaves membership.

It answers `PrefixHolders` from the prompt's approximate prefix keys (`prompt.prefix_keys`: characters,
not tokens; the first `key_blocks` blocks, then twice as many characters, four times, ...) for fleets
without KV-cache events: an endpoint's share of a prompt is how far into those keys it was sent, so a
prompt whose first blocks every engine holds (a shared system prompt) still goes where its document or
its session's history went. The KV-event index answers the same question from the engines' own block
events.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.prompt import request_prefix_key, request_prefix_keys
from corral.router.routing.request import RouteRequest

log = logging.getLogger("corral.router.prefix_memory")

# 8192 keys of 8 bytes (plus the dict's overhead, ~100 bytes a key): about 0.8 MB per endpoint. A prompt
# sends one key per depth (a few, `prompt.MAX_LEVELS` at most), so this is more prefixes than an
# engine's cache holds.
DEFAULT_KEYS_PER_ENDPOINT = 8192
# The prompt key: whole blocks of this many characters (about a quarter as many tokens), at most
# this many of them (the routing config's block_chars and key_blocks).
DEFAULT_BLOCK_CHARS = 128
DEFAULT_KEY_BLOCKS = 4


def _epoch(endpoint: Endpoint) -> str | None:
    view = endpoint.supervisor
    return view.prefix_epoch if view is not None else None


class _Keys:
    """One endpoint's keys, valid for one endpoint object at one prefix epoch."""

    __slots__ = ("endpoint", "epoch", "keys", "prefixes")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.epoch = _epoch(endpoint)
        # key -> whether it is a prompt's first key (one per prefix; the deeper keys extend it)
        self.keys: OrderedDict[int, bool] = OrderedDict()
        self.prefixes = 0  # first keys among `keys`


class PrefixMemory:
    """Bounded per-endpoint LRU sets of prefix keys; O(1) per key and endpoint. A prompt's share is 1
    on an endpoint that was sent its key, else 0."""

    def __init__(
        self,
        keys_per_endpoint: int = DEFAULT_KEYS_PER_ENDPOINT,
        *,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        key_blocks: int = DEFAULT_KEY_BLOCKS,
    ) -> None:
        if keys_per_endpoint < 1:
            raise ValueError(f"keys_per_endpoint {keys_per_endpoint}: must be at least 1")
        self.keys_per_endpoint = keys_per_endpoint
        self.block_chars = block_chars
        self.key_blocks = key_blocks
        self._by_url: dict[str, _Keys] = {}
        self._urls_of: dict[int, dict[str, None]] = {}  # key -> the urls it was sent to (`holders`)
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
            for key in entry.keys:
                self._unsent(key, url)
            self.forgotten += 1
            log.info("forgot %d prefix keys of %s: %s", len(entry.keys), url, why)

    def key(self, request: RouteRequest) -> int | None:
        """The request's prefix key, computed once per request; None when the prompt has no whole block."""
        return request_prefix_key(request, self.block_chars, self.key_blocks)

    def keys(self, request: RouteRequest) -> list[tuple[int, int]]:
        """The request's keys at growing depths with the characters each covers (`prompt.prefix_keys`)."""
        return request_prefix_keys(request, self.block_chars, self.key_blocks)

    def held(self, request: RouteRequest, pool: Sequence[Endpoint]) -> list[float]:
        """Per endpoint, the characters of the deepest of the prompt's keys it was sent (and each
        shallower one), over the deepest key's: 1 when it was sent this prompt's whole keyed prefix."""
        keys = self.keys(request)
        if not keys:
            return [0.0] * len(pool)
        total = keys[-1][1]
        by_url = self._by_url
        shares: list[float] = []
        for e in pool:
            entry = by_url.get(e.url)
            # the fast check of `_current` (the same engine at the same epoch), which it repeats otherwise
            if entry is not None and (entry.endpoint is not e or entry.epoch != _epoch(e)):
                entry = self._current(e)
            if entry is None:
                shares.append(0.0)
                continue
            held = entry.keys
            depth = 0
            for key, chars in keys:
                if key not in held:
                    break
                depth = chars
            shares.append(depth / total)
        return shares

    def holds(self, key: int, endpoint: Endpoint) -> bool:
        entry = self._current(endpoint)
        return entry is not None and key in entry.keys

    def holding(self, key: int, pool: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints of `pool` that were sent `key` (and still count as holding it), in order."""
        return [e for e in pool if self.holds(key, e)]

    def sent(self, request: RouteRequest, endpoint: Endpoint) -> None:
        for depth, (key, _) in enumerate(self.keys(request)):
            self.remember(key, endpoint, first=depth == 0)

    def remember(self, key: int, endpoint: Endpoint, first: bool = True) -> None:
        """`endpoint` was sent a prompt with `key` (its first key, or with `first=False` a deeper one):
        it will cache the prefix."""
        entry = self._current(endpoint)
        if entry is None:
            entry = self._by_url[endpoint.url] = _Keys(endpoint)
        keys = entry.keys
        if key not in keys:
            keys[key] = first
            entry.prefixes += first
        keys.move_to_end(key)
        self._urls_of.setdefault(key, {})[endpoint.url] = None
        if len(keys) > self.keys_per_endpoint:
            old, was_first = keys.popitem(last=False)
            entry.prefixes -= was_first
            self._unsent(old, endpoint.url)

    def _unsent(self, key: int, url: str) -> None:
        urls = self._urls_of.get(key)
        if urls is not None:
            urls.pop(url, None)
            if not urls:
                del self._urls_of[key]

    def forget_deeper(self, request: RouteRequest, endpoint: Endpoint, chars: float) -> int:
        """`endpoint`'s engine served only the first `chars` characters of the prompt from its cache (it
        evicted the rest): forget its keys of the prompt that cover more; how many were forgotten."""
        entry = self._current(endpoint)
        if entry is None:
            return 0
        keys = entry.keys
        dropped = 0
        for key, covers in self.keys(request):
            if covers <= chars or key not in keys:
                continue
            entry.prefixes -= keys.pop(key)
            self._unsent(key, endpoint.url)
            dropped += 1
        return dropped

    def holders(self, request: RouteRequest) -> Iterator[str]:
        """The endpoints sent some of the prompt's keys, those sent the deepest first, each once; lazy,
        so a pick that needs the first few holders of a prefix held by many reads no further."""
        seen: set[str] = set()
        urls_of = self._urls_of
        for key, _ in reversed(self.keys(request)):
            urls = urls_of.get(key)
            if urls:
                for url in urls:
                    if url not in seen:
                        seen.add(url)
                        yield url

    def forget(self, url: str, why: str) -> None:
        """Drop an endpoint's keys now (it left membership)."""
        self._drop(url, why)

    def placed(self, endpoint: Endpoint) -> int:
        """How many prefixes (first keys) the router holds for `endpoint` (0 once they no longer apply)."""
        entry = self._current(endpoint)
        return 0 if entry is None else entry.prefixes

    def to_json(self, endpoint: Endpoint) -> dict[str, Any]:
        entry = self._current(endpoint)
        return {
            "keys": 0 if entry is None else entry.prefixes,
            "capacity": self.keys_per_endpoint,
            "prefix_epoch": None if entry is None else entry.epoch,
        }
