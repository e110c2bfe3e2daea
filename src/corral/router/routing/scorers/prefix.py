"""Prefix affinity: the prompt's leading blocks have a home, found by consistent hashing over the
eligible endpoints, so every router replica with the same membership names the same home without
talking to the others, and an engine joining or leaving moves only the keys next to it on the ring.

The home scores 1, the next endpoint clockwise 1/2, the next 1/4, ...; endpoints the load-bound filter
removed are skipped, so an overloaded home spills to the same second endpoint on every replica (which
then caches the prefix too). A prompt shorter than one block has no home: every endpoint scores 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.prompt import prefix_key
from corral.router.routing.rings import RingCache
from corral.router.routing.scorers import PickContext

DEFAULT_BLOCK_CHARS = 128
DEFAULT_KEY_BLOCKS = 4


class PrefixScorer:
    name = "prefix"

    def __init__(self, block_chars: int = DEFAULT_BLOCK_CHARS, key_blocks: int = DEFAULT_KEY_BLOCKS) -> None:
        self.block_chars = block_chars
        self.key_blocks = key_blocks
        self._rings = RingCache()

    def home_order(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[Endpoint] | None:
        """`pool` in the ring order of the request's prefix key; None when the prompt has no key."""
        key = prefix_key(ctx.request.payload, self.block_chars, self.key_blocks)
        if key is None:
            return None
        allowed = {id(e) for e in pool}
        return [e for e in self._rings.ring(ctx.eligible).walk(key) if id(e) in allowed]

    def score(self, pool: Sequence[Endpoint], ctx: PickContext) -> list[float]:
        order = self.home_order(pool, ctx)
        if order is None:
            return [0.0] * len(pool)
        rank = {id(e): 0.5**i for i, e in enumerate(order)}
        return [rank.get(id(e), 0.0) for e in pool]
