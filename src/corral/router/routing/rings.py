"""Consistent-hash rings of virtual nodes over candidate sets, and the one cache that keeps a ring
per distinct set (a fleet has few); the session policy and the prefix and session scorers walk them.

Every endpoint's virtual nodes depend on its url alone, so the ring of a set is the ring of every url
the cache has seen, walked past the urls not in the set: the cache keeps one sorted ring of all the urls
it has seen (`Points`), grown by inserting a newcomer's nodes, and a set's `Ring` is a view of it. So a
membership change (an endpoint leaving, coming back, its state flipping) costs no rehashing and no
sort. On a membership `EligibleSet` (the same object for every request until membership changes) the
cache answers by identity; another sequence is looked up by its endpoints' urls. A ring finds the first
endpoint clockwise from a key in O(log n) (`walk`) and orders a small pool of endpoints by their
distance from a key in O(pool) (`ordered`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from hashlib import blake2b

from corral.router.membership.eligible import EligibleSet
from corral.router.membership.endpoint import Endpoint

VIRTUAL_NODES = 64
RING_CACHE_SIZE = 32
_SPACE = 1 << 64
# Past this many urls ever seen (pods come and go with new addresses), the shared ring starts over.
POINTS_CACHE_SIZE = 16384


def stable_hash(key: str) -> int:
    """A hash that is the same in every process (Python's str hash is salted per process)."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "big")


def virtual_nodes(url: str, count: int = VIRTUAL_NODES) -> list[int]:
    """The sorted ring positions of `url`'s virtual nodes."""
    return sorted(stable_hash(f"{url}#{v}") for v in range(count))


class Points:
    """The virtual nodes of every url seen, sorted: `hashes[i]` belongs to `urls[i]`."""

    __slots__ = ("hashes", "of", "urls")

    def __init__(self) -> None:
        self.hashes: list[int] = []
        self.urls: list[str] = []
        self.of: dict[str, list[int]] = {}  # url -> its nodes, sorted

    def include(self, urls: Sequence[str]) -> None:
        new = [u for u in dict.fromkeys(urls) if u not in self.of]
        if not new:
            return
        for url in new:
            self.of[url] = virtual_nodes(url)
        if len(new) * VIRTUAL_NODES * 16 < len(self.hashes):  # a few newcomers: insert them in place
            for url in new:
                for h in self.of[url]:
                    i = bisect.bisect_left(self.hashes, h)
                    self.hashes.insert(i, h)
                    self.urls.insert(i, url)
            return
        ring = sorted((h, url) for url, nodes in self.of.items() for h in nodes)
        self.hashes = [h for h, _ in ring]
        self.urls = [u for _, u in ring]


class Ring:
    """The ring of a fixed endpoint set: a view of the shared `Points`."""

    __slots__ = ("_members", "_points", "endpoints")

    def __init__(self, endpoints: Sequence[Endpoint], points: Points | None = None) -> None:
        self.endpoints = tuple(endpoints)
        if points is None:
            points = Points()
        points.include([e.url for e in self.endpoints])
        self._points = points
        self._members: Mapping[str, Endpoint] = (
            endpoints.by_url if isinstance(endpoints, EligibleSet) else {e.url: e for e in self.endpoints}
        )

    def walk(self, key_hash: int) -> Iterator[Endpoint]:
        """Endpoints in ring order clockwise from `key_hash`, each once."""
        members = self._members
        n = len(members)
        hashes, urls = self._points.hashes, self._points.urls
        size = len(hashes)
        start = bisect.bisect_left(hashes, key_hash)
        seen: set[str] = set()  # not n flags: a walk usually stops after a few
        for k in range(size):
            url = urls[(start + k) % size]
            if url not in seen:
                endpoint = members.get(url)
                if endpoint is None:
                    continue
                seen.add(url)
                yield endpoint
                if len(seen) == n:
                    return

    def ordered(self, key_hash: int, pool: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints of `pool` on this ring in the order `walk(key_hash)` meets them (others are
        left out): each by the clockwise distance from the key to its nearest virtual node."""
        members, nodes_of = self._members, self._points.of
        ranked: list[tuple[int, int, Endpoint]] = []
        for i, e in enumerate(pool):
            if members.get(e.url) is not e:
                continue
            points = nodes_of[e.url]
            j = bisect.bisect_left(points, key_hash)
            distance = points[j] - key_hash if j < len(points) else points[0] + _SPACE - key_hash
            ranked.append((distance, i, e))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [e for _, _, e in ranked]

    def first(self, key_hash: int, pool: Sequence[Endpoint]) -> Endpoint | None:
        """`ordered(key_hash, pool)[0]` without ordering the rest (None when no endpoint of `pool` is on
        this ring): the tie-break of every pick whose best scores tie."""
        members, nodes_of = self._members, self._points.of
        best: Endpoint | None = None
        best_distance = _SPACE
        for e in pool:
            if members.get(e.url) is not e:
                continue
            points = nodes_of[e.url]
            j = bisect.bisect_left(points, key_hash)
            distance = points[j] - key_hash if j < len(points) else points[0] + _SPACE - key_hash
            if distance < best_distance:  # the earlier of two at the same distance, as `ordered`
                best, best_distance = e, distance
        return best


class RingCache:
    """The ring of each candidate set seen lately, rebuilt when the set's endpoints are new objects
    (an endpoint that left and came back) and emptied whole past `RING_CACHE_SIZE` sets; every ring a
    view of one shared `Points`."""

    __slots__ = ("_by_identity", "_points", "_rings")

    def __init__(self) -> None:
        self._rings: dict[tuple[str, ...], Ring] = {}
        # id(set) -> (the set, its ring): the set is held so that its id is not reused while cached
        self._by_identity: dict[int, tuple[Sequence[Endpoint], Ring]] = {}
        self._points = Points()

    def ring(self, candidates: Sequence[Endpoint]) -> Ring:
        known = self._by_identity.get(id(candidates))
        if known is not None and known[0] is candidates:
            return known[1]
        key = tuple(e.url for e in candidates)
        ring = self._rings.get(key)
        if ring is None or ring.endpoints != tuple(candidates):
            if len(self._rings) >= RING_CACHE_SIZE:
                self._rings.clear()
            if len(self._points.of) >= POINTS_CACHE_SIZE:
                self._points = Points()
                self._rings.clear()
                self._by_identity.clear()
            ring = self._rings[key] = Ring(candidates, self._points)
        if len(self._by_identity) >= RING_CACHE_SIZE:
            self._by_identity.clear()
        # only a membership set is immutable by contract; a plain list may be reused and changed
        if isinstance(candidates, EligibleSet):
            self._by_identity[id(candidates)] = (candidates, ring)
        return ring
