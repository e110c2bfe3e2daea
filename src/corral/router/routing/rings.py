"""Consistent-hash rings of virtual nodes over candidate sets, and the one cache that keeps a ring
per distinct set (a fleet has few); the session policy and the prefix and session scorers walk them."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from hashlib import blake2b

from corral.router.membership.endpoint import Endpoint

VIRTUAL_NODES = 64
RING_CACHE_SIZE = 32


def stable_hash(key: str) -> int:
    """A hash that is the same in every process (Python's str hash is salted per process)."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "big")


class Ring:
    """Virtual nodes of a fixed endpoint set, sorted by hash."""

    __slots__ = ("endpoints", "hashes", "owners")

    def __init__(self, endpoints: Sequence[Endpoint], virtual_nodes: int = VIRTUAL_NODES) -> None:
        points = sorted(
            (stable_hash(f"{e.url}#{v}"), i) for i, e in enumerate(endpoints) for v in range(virtual_nodes)
        )
        self.endpoints = tuple(endpoints)
        self.hashes = [h for h, _ in points]
        self.owners = [i for _, i in points]

    def walk(self, key_hash: int) -> Iterator[Endpoint]:
        """Endpoints in ring order clockwise from `key_hash`, each once."""
        n = len(self.endpoints)
        size = len(self.hashes)
        start = bisect.bisect_left(self.hashes, key_hash)
        seen = [False] * n
        found = 0
        for k in range(size):
            owner = self.owners[(start + k) % size]
            if not seen[owner]:
                seen[owner] = True
                yield self.endpoints[owner]
                found += 1
                if found == n:
                    return


class RingCache:
    """The ring of each candidate set seen lately, rebuilt when the set's endpoints are new objects
    (an endpoint that left and came back) and emptied whole past `RING_CACHE_SIZE` sets."""

    __slots__ = ("_rings",)

    def __init__(self) -> None:
        self._rings: dict[tuple[str, ...], Ring] = {}

    def ring(self, candidates: Sequence[Endpoint]) -> Ring:
        key = tuple(e.url for e in candidates)
        ring = self._rings.get(key)
        if ring is None or ring.endpoints != tuple(candidates):
            if len(self._rings) >= RING_CACHE_SIZE:
                self._rings.clear()
            ring = self._rings[key] = Ring(candidates)
        return ring
