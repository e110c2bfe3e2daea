"""Consistent-hash rings of virtual nodes over candidate sets, and the one cache that keeps a ring
per distinct set (a fleet has few); the session policy and the prefix and session scorers walk them.

On a membership `EligibleSet` (the same object for every request until membership changes) the cache
answers by identity, in O(1); another sequence is looked up by its endpoints' urls. A ring of n
endpoints answers the first endpoint clockwise from a key in O(log n) (`walk`), and orders a small pool
of them by their distance from the key in O(pool) (`ordered`), without walking the ring.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from hashlib import blake2b

from corral.router.membership.eligible import EligibleSet
from corral.router.membership.endpoint import Endpoint

VIRTUAL_NODES = 64
RING_CACHE_SIZE = 32
_SPACE = 1 << 64
# url -> its virtual nodes' hashes, sorted; kept across rings (a ring rebuilt after one endpoint joins
# hashes only the newcomer), emptied whole past this many urls.
POINTS_CACHE_SIZE = 16384


def stable_hash(key: str) -> int:
    """A hash that is the same in every process (Python's str hash is salted per process)."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "big")


def virtual_nodes(url: str, count: int = VIRTUAL_NODES) -> list[int]:
    """The sorted ring positions of `url`'s virtual nodes."""
    return sorted(stable_hash(f"{url}#{v}") for v in range(count))


class Ring:
    """Virtual nodes of a fixed endpoint set, sorted by hash."""

    __slots__ = ("_index", "_points", "endpoints", "hashes", "owners")

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        virtual_nodes_of: dict[str, list[int]] | None = None,
    ) -> None:
        known = virtual_nodes_of if virtual_nodes_of is not None else {}
        self.endpoints = tuple(endpoints)
        self._points: list[list[int]] = []
        for e in self.endpoints:
            points = known.get(e.url)
            if points is None:
                points = known[e.url] = virtual_nodes(e.url)
            self._points.append(points)
        self._index = {id(e): i for i, e in enumerate(self.endpoints)}
        ring = sorted((h, i) for i, points in enumerate(self._points) for h in points)
        self.hashes = [h for h, _ in ring]
        self.owners = [i for _, i in ring]

    def walk(self, key_hash: int) -> Iterator[Endpoint]:
        """Endpoints in ring order clockwise from `key_hash`, each once."""
        n = len(self.endpoints)
        size = len(self.hashes)
        start = bisect.bisect_left(self.hashes, key_hash)
        seen: set[int] = set()  # not a list of n flags: a walk usually stops after a few
        owners, endpoints = self.owners, self.endpoints
        for k in range(size):
            owner = owners[(start + k) % size]
            if owner not in seen:
                seen.add(owner)
                yield endpoints[owner]
                if len(seen) == n:
                    return

    def ordered(self, key_hash: int, pool: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints of `pool` on this ring in the order `walk(key_hash)` meets them (others are
        left out): each by the clockwise distance from the key to its nearest virtual node."""
        index, points_of = self._index, self._points
        ranked: list[tuple[int, int, Endpoint]] = []
        for e in pool:
            i = index.get(id(e))
            if i is None or self.endpoints[i] is not e:
                continue
            points = points_of[i]
            j = bisect.bisect_left(points, key_hash)
            distance = points[j] - key_hash if j < len(points) else points[0] + _SPACE - key_hash
            ranked.append((distance, i, e))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [e for _, _, e in ranked]


class RingCache:
    """The ring of each candidate set seen lately, rebuilt when the set's endpoints are new objects
    (an endpoint that left and came back) and emptied whole past `RING_CACHE_SIZE` sets."""

    __slots__ = ("_by_identity", "_points", "_rings")

    def __init__(self) -> None:
        self._rings: dict[tuple[str, ...], Ring] = {}
        # id(set) -> (the set, its ring): the set is held so that its id is not reused while cached
        self._by_identity: dict[int, tuple[Sequence[Endpoint], Ring]] = {}
        self._points: dict[str, list[int]] = {}

    def ring(self, candidates: Sequence[Endpoint]) -> Ring:
        known = self._by_identity.get(id(candidates))
        if known is not None and known[0] is candidates:
            return known[1]
        key = tuple(e.url for e in candidates)
        ring = self._rings.get(key)
        if ring is None or ring.endpoints != tuple(candidates):
            if len(self._rings) >= RING_CACHE_SIZE:
                self._rings.clear()
            if len(self._points) >= POINTS_CACHE_SIZE:
                self._points.clear()
            ring = self._rings[key] = Ring(candidates, self._points)
        if len(self._by_identity) >= RING_CACHE_SIZE:
            self._by_identity.clear()
        # only a membership set is immutable by contract; a plain list may be reused and changed
        if isinstance(candidates, EligibleSet):
            self._by_identity[id(candidates)] = (candidates, ring)
        return ring
