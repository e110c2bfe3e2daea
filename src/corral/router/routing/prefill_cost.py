"""Placement by cost: each candidate's expected time to a prompt's first token, in one unit (prompt
tokens to prefill), so no engine's speed needs to be known.

For a candidate e, the estimate is wait(e) + decode(e) + cost(e):

- wait(e): this host's requests sent to e that have not had their first byte yet, in uncached prompt
  tokens (`Endpoint.host_prefill_tokens`: an engine computes one prefill stream at a time, so a request
  waits for the prefills ahead of it), plus the requests e's own `/metrics` says wait
  (`vllm:num_requests_waiting`) beyond those of this host it has, each at a typical prompt's uncached
  tokens: other replicas' traffic, seen a scrape late. An engine without fresh metrics is priced by
  this host's requests alone: a penalty for it (as the load scorers score it saturated) moved prompts
  off their holders while a router's first scrapes came in, one engine after another.
- decode(e): each of this host's requests at e past its first token costs `DECODE_SHARE` of a typical
  prompt: decodes share the engine's steps with the prefill (chunked prefill) and hold its sequence slots.
- cost(e): the prompt's tokens less those e likely holds (`PrefixHolders` share of the keyed prefix).

A hit is worth the prefill it saves, no more: a holder whose queue is longer than what it saves loses
to a shorter queue, which then holds the prefix too. Prompt tokens are characters / `CHARS_PER_TOKEN`
(a router without a tokenizer); both sides of the sum use the same estimate, so its error cancels.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.load_board import EngineLoad

CHARS_PER_TOKEN = 4.0
# A request past its first token costs this share of a typical prompt's prefill: a small price, so that
# of two equal prefill queues the engine decoding less wins, and a pile of long decodes is seen before
# the engine's waiting count says so.
DECODE_SHARE = 0.1
# The typical prompt's uncached tokens: a moving average over the picks, this weight for the newest.
TYPICAL_WEIGHT = 0.05


class PrefillCost:
    """The estimates of one policy; it learns the typical uncached prompt from its own picks."""

    __slots__ = ("block_chars", "typical")

    def __init__(self, block_chars: int) -> None:
        self.block_chars = block_chars
        self.typical = 0.0  # uncached prompt tokens of a typical pick; 0 before the first

    def prompt_tokens(self, keyed_chars: int) -> float:
        """A prompt's tokens from the characters its prefix keys cover (whole blocks): the tail after
        the last whole block is counted at half a block."""
        return (keyed_chars + self.block_chars / 2) / CHARS_PER_TOKEN

    def wait(self, endpoint: Endpoint, load: EngineLoad | None, typical: float) -> float:
        """The prefill tokens ahead of a new request at `endpoint`, and its decodes' price, a request
        the router does not know of costing `typical` tokens."""
        ours = endpoint.host_prefilling
        others = 0.0 if load is None else max(0.0, load.waiting - ours)
        # the engine's running requests (other replicas' too), less those of ours still in prefill
        decoding = max(endpoint.host_in_flight - ours, 0.0 if load is None else load.running - ours)
        return endpoint.host_prefill_tokens + typical * (others + DECODE_SHARE * decoding)

    def estimates(
        self,
        pool: Sequence[Endpoint],
        loads: Sequence[EngineLoad | None],
        shares: Sequence[float],
        prompt: float,
        keyed: float,
    ) -> tuple[list[float], list[float]]:
        """Per endpoint of `pool`, in order: the expected prefill tokens before the first token of a
        `prompt` (tokens) whose `keyed` leading tokens it holds `shares` of, and the prompt's tokens
        left to compute there."""
        uncached = [prompt - share * keyed for share in shares]
        typical = self.typical or prompt  # before the first pick, this prompt is the typical one
        wait = self.wait
        estimates = [wait(e, load, typical) + u for e, load, u in zip(pool, loads, uncached, strict=True)]
        return estimates, uncached

    def picked(self, uncached: float) -> None:
        """A pick expects `uncached` tokens to compute: the typical prompt moves toward it."""
        typical = self.typical
        self.typical = uncached if typical == 0.0 else typical + TYPICAL_WEIGHT * (uncached - typical)
