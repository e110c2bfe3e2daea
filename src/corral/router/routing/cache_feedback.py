"""A prefix memory that learns what an engine forgot (issue 28 item 4): without KV events the router
never sees an eviction, but an engine run with `--enable-prompt-tokens-details` says in each answer's
usage how many prompt tokens its prefix cache served (`prompt_tokens_details.cached_tokens`). When a
pick expected a hit and the engine served far less, the memory forgets that engine's keys of the
prompt deeper than what it served, so the next pick prices that engine as it is.

vLLM 0.32 writes the details on a miss too (`cached_tokens: 0`); older vLLM wrote none when nothing was
cached (`if enable_prompt_tokens_details and num_cached_tokens`): an answer without them is a full miss
only from an engine that has sent details before (`CacheFeedback.reporting`); from any other it says
nothing. The usage is found in the answer's
bytes (a non-streamed body, or a stream's last events: a stream carries usage only when its client
asked for it with `stream_options.include_usage`; the router does not ask on its behalf).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.router.membership.endpoint import Endpoint
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.request import RouteRequest

# A count of at most 12 digits (what an engine answers comes from the network: int() of a 5,000-digit run
# raises); a longer run does not match, and the answer teaches nothing.
_PROMPT = re.compile(rb'"prompt_tokens":\s{0,16}([0-9]{1,12})(?![0-9])')
_CACHED = re.compile(rb'"cached_tokens":\s{0,16}([0-9]{1,12})(?![0-9])')
# A hit counts as missed when the engine served less than this share of the prompt the memory expected
# it to hold: the memory's characters and the engine's tokens and blocks differ by far less.
MISSED = 0.5


class CacheFeedback:
    """One memory's corrections; `reporting` are the endpoints that have sent cached-token details."""

    def __init__(self, memory: PrefixMemory) -> None:
        self.memory = memory
        self.reporting: set[str] = set()
        self.corrections = 0  # picks whose expected hit the engine did not serve

    def expect(self, request: RouteRequest, endpoint: Endpoint, held: float, prompt_chars: float) -> None:
        """The pick sent `request` to `endpoint` expecting `held` of its `prompt_chars` cached there."""
        request.expected_hit = ExpectedHit(self, request, endpoint, held / prompt_chars, prompt_chars)

    def answered(self, hit: ExpectedHit, usage: bytes) -> None:
        found = _PROMPT.search(usage)
        if found is None:
            return
        url = hit.endpoint.url
        cached = _CACHED.search(usage)
        if cached is not None:
            self.reporting.add(url)
            served = int(cached.group(1))
        elif url in self.reporting:
            served = 0
        else:
            return  # an engine that never said what it cached: nothing learnt
        prompt = int(found.group(1))
        if prompt <= 0 or served >= MISSED * hit.share * prompt:
            return
        self.corrections += 1
        self.memory.forget_deeper(hit.request, hit.endpoint, served / prompt * hit.prompt_chars)


@dataclass(slots=True)
class ExpectedHit:
    """What a pick expected the chosen engine's cache to serve of the prompt, until its answer says."""

    feedback: CacheFeedback
    request: RouteRequest
    endpoint: Endpoint
    share: float  # of the prompt
    prompt_chars: float

    def answered(self, body: bytes) -> None:
        """An answer's bytes (a whole body, or a stream's last events): learn from its usage, if any."""
        at = body.rfind(b'"usage"')
        if at >= 0:
            self.feedback.answered(self, body[at:])
