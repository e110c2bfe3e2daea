"""`PrefixHolders` answered from the engines' KV-cache events: the share of a request's leading token
blocks each endpoint holds, from the `KvIndex`, for the endpoints whose events the router follows; the
others are asked of the approximate memory (`fallback`), so a fleet that half publishes events still
routes by prefix everywhere. Reading the index never fails a request: should it raise (what engines
sent is untrusted; the feeds refuse what is out of bounds, this is the second line), the pick asks the
memory for every endpoint, counted and logged once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.kv_index import KvIndex
from corral.router.routing.prefix_holders import PrefixHolders
from corral.router.routing.prompt_tokens import PromptTokens
from corral.router.routing.request import RouteRequest
from corral.router.telemetry.engine_input import EngineInputRefusals

log = logging.getLogger("corral.router.kv_events")

_DERIVED = "kv_chains"  # block size -> the request's content keys, under RouteRequest.derived
_TOKENS = "kv_tokens"  # the request's token ids (None: no single prompt)


class KvPrefixHolders:
    """Longest held prefix per endpoint from the KV index; `publishing(url)` says which endpoints'
    events are followed (the feeds), the rest fall back."""

    def __init__(
        self,
        index: KvIndex,
        tokenizer: PromptTokens,
        publishing: Callable[[str], bool],
        fallback: PrefixHolders,
        refusals: EngineInputRefusals | None = None,
    ) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.publishing = publishing
        self.fallback = fallback
        self.refusals = refusals if refusals is not None else EngineInputRefusals()

    def _failed(self, exc: Exception) -> None:
        self.refusals.kv_fallbacks += 1
        if self.refusals.kv_fallbacks == 1:
            log.error("KV index failed a pick (%s: %s); the prefix memory answered", type(exc).__name__, exc)

    def _chain(self, request: RouteRequest, block_size: int) -> list[int]:
        """The content keys of the prompt's full blocks of `block_size` tokens, computed once per request
        (under `RouteRequest.derived`)."""
        derived = request.derived
        if derived is None:
            derived = request.derived = {}
        chains: dict[int, list[int]] | None = derived.get(_DERIVED)
        if chains is None:
            chains = derived[_DERIVED] = {}
        chain = chains.get(block_size)
        if chain is None:
            tokens = derived.get(_TOKENS, False)
            if tokens is False:
                tokens = derived[_TOKENS] = self.tokenizer.tokens(request.payload)
            root = self.index.root_of_model(request.model)
            chain = chains[block_size] = [] if tokens is None else self.index.chain(tokens, block_size, root)
        return chain

    def held(self, request: RouteRequest, pool: Sequence[Endpoint]) -> list[float]:
        try:
            return self._held(request, pool)
        except Exception as exc:  # never a 500: the memory answers for every endpoint
            self._failed(exc)
            return self.fallback.held(request, pool)

    def _held(self, request: RouteRequest, pool: Sequence[Endpoint]) -> list[float]:
        shares = [0.0] * len(pool)
        others: list[int] = []
        partial: list[int] = []  # endpoints holding some of the prompt's blocks, not all
        longest: dict[int, tuple[int, dict[str, int]]] = {}  # block size -> (blocks, held per url)
        for i, endpoint in enumerate(pool):
            url = endpoint.url
            if not self.publishing(url):
                others.append(i)
                continue
            # an engine that stored nothing yet may hold a pending pick, in its peers' block size
            block_size = self.index.block_size(url) or self.index.common_block_size()
            if block_size is None:
                continue  # no engine stored anything yet: nothing is held
            found = longest.get(block_size)
            if found is None:
                chain = self._chain(request, block_size)
                found = longest[block_size] = (len(chain), self.index.longest(chain))
            total, depths = found
            if total:
                shares[i] = share = depths.get(url, 0) / total
                if 0.0 < share < 1.0:
                    partial.append(i)
        # One read of the memory for the endpoints without events (it answers for them) and those the
        # events show holding the prompt's start but not its tail: an engine evicts the tail first, and
        # where this router sent all of the prompt it stays that prompt's holder (its next request there
        # recomputes the tail only), rather than a new placement that recomputes all of it elsewhere and
        # evicts the prompts there.
        asked = others + partial
        if asked:
            remembered = self.fallback.held(request, [pool[i] for i in asked])
            for k, (i, share) in enumerate(zip(asked, remembered, strict=True)):
                if k < len(others) or share > shares[i]:
                    shares[i] = share
        return shares

    def holders(self, request: RouteRequest) -> Iterator[str]:
        try:
            block_size = self.index.common_block_size()
            held = self.index.longest(self._chain(request, block_size)) if block_size is not None else {}
        except Exception as exc:
            self._failed(exc)
            held = {}
        # deepest first: a pick on a large fleet scores only the first few holders
        deepest = sorted((item for item in held.items() if item[1]), key=lambda item: -item[1])
        yield from (url for url, _ in deepest)
        yield from self.fallback.holders(request)

    def placed(self, endpoint: Endpoint) -> int:
        # the memory learns every pick (`sent`): it counts the prefixes placed on each endpoint; the
        # index counts blocks, which a cache at capacity always has
        return self.fallback.placed(endpoint)

    def sent(self, request: RouteRequest, endpoint: Endpoint) -> None:
        url = endpoint.url
        try:
            if self.publishing(url):
                block_size = self.index.block_size(url) or self.index.common_block_size()
                if block_size is not None:
                    self.index.sent(url, self._chain(request, block_size))
        except Exception as exc:
            self._failed(exc)
        # the approximate memory learns every pick too: it answers at once if the events stop
        self.fallback.sent(request, endpoint)
