"""Deterministic output: the token stream a request gets, decided up front from the seed and the request.

Same simulator seed, same prompt and same sampling parameters give the same text. With `temperature: 0`
the request's own `seed` is ignored (greedy decoding has no randomness). Without `max_tokens` the stream
ends at a drawn end-of-sequence token (`finish_reason: "stop"`); with it, at `max_tokens` ("length").
A `stop` string ends it early with `finish_reason: "stop"` and `stop_reason` set to that string,
the stop string itself excluded from the text as vLLM does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from corral.engine.sim_tokenizer import MAX_TOKEN_CHARS, WORDS

# Punctuation is over-represented so that `stop: ["."]` or `["\n"]` is reached within a few tokens.
_PUNCTUATION: tuple[str, ...] = (".",) * 8 + (",",) * 8 + ("\n",) * 3
_POOL: tuple[str, ...] = tuple(" " + w for w in WORDS if len(w) < MAX_TOKEN_CHARS) + _PUNCTUATION


@dataclass(frozen=True)
class GenerationPlan:
    """The text each output token adds, and why the stream ends."""

    deltas: list[str]
    finish_reason: str
    stop_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.deltas)

    @property
    def text(self) -> str:
        return "".join(self.deltas)


class Generator:
    def __init__(self, seed: int, default_max_tokens: int) -> None:
        self.seed = seed
        self.default_max_tokens = default_max_tokens

    def plan(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int | None,
        context_left: int,
        temperature: float = 1.0,
        request_seed: int | None = None,
        stop: Sequence[str] = (),
    ) -> GenerationPlan:
        """Decide the output for a prompt; `context_left` is `max_model_len - prompt_len` (at least 1)."""
        if temperature == 0:
            key = hash((self.seed, 0.0, -1, tuple(prompt_ids)))
        else:
            key = hash(
                (
                    self.seed,
                    float(temperature),
                    -1 if request_seed is None else request_seed,
                    tuple(prompt_ids),
                )
            )
        rng = random.Random(key)
        context_left = max(1, context_left)
        if max_tokens is None:
            budget = max(1, self.default_max_tokens)
            length = rng.randint(max(1, budget // 2), budget)
            finish = "stop"
            if length >= context_left:
                length, finish = context_left, "length"
        else:
            length, finish = min(max_tokens, context_left), "length"
        pieces = rng.choices(_POOL, k=length)
        if stop:
            return _apply_stop(pieces, stop) or GenerationPlan(pieces, finish)
        return GenerationPlan(pieces, finish)


def _apply_stop(pieces: list[str], stops: Sequence[str]) -> GenerationPlan | None:
    text = "".join(pieces)
    best: tuple[int, str] | None = None
    for s in stops:
        if not s:
            continue
        at = text.find(s)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, s)
    if best is None:
        return None
    at, s = best
    end_needed = at + len(s)
    deltas: list[str] = []
    pos = 0
    for piece in pieces:
        start, pos = pos, pos + len(piece)
        deltas.append(piece[: max(0, at - start)] if pos > at else piece)
        if pos >= end_needed:
            break
    return GenerationPlan(deltas, "stop", s)


GARBAGE_TOKEN = " <unknown-weights>"


def garbage(plan: GenerationPlan) -> GenerationPlan:
    """What an engine answers from weight memory that holds no model: as long as planned, but noise.

    vLLM serves a level-2-woken engine whose weights were not reloaded without any error; the simulator
    marks each token so that a test (or an operator's smoke request) can see it.
    """
    return GenerationPlan([GARBAGE_TOKEN] * plan.num_tokens, plan.finish_reason, plan.stop_reason)
