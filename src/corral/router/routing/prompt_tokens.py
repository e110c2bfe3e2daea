"""The token ids an engine will prefill for a request, computed in the router so that its blocks can be
compared with the blocks the engines report in their KV events (`--tokenizer`): `sim` tokenizes as
`corral sim` does (its chat rendering and toy tokenizer); a path or model name loads that model's
tokenizer and chat template with `transformers`, when it is installed (an optional dependency).

Only the prompt's start is tokenized, never more than `MAX_ROUTED_CHARS` characters (or
`MAX_ROUTED_TOKENS` token ids given as such): the index keys blocks chained from the prompt's start, so a
prefix of it routes as the whole would, and tokenizing runs on the router's event loop (a 30 MiB prompt
held every other request, `/health` included, for seconds). A prompt cut there loses its last
`CUT_MARGIN_TOKENS` tokens too, whose split may depend on the characters cut off."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from corral.engine.sim_chat import render_chat
from corral.engine.sim_tokenizer import ToyTokenizer

SIM_TOKENIZER = "sim"

# 64 Ki characters: ~16k tokens of English (1,000 blocks of 16), deeper than the shared starts prefix
# routing tells apart (system prompts, few-shot examples, a session's history against another's); two
# prompts alike that far are routed as if alike throughout (to the engine holding that start). Costs
# ~7 ms of the sim's toy tokenizer at most (256 Ki: 23 ms, 1 Mi: 92 ms; a 30 MiB prompt whole: 6.5 s).
MAX_ROUTED_CHARS = 1 << 16
MAX_ROUTED_TOKENS = 1 << 16
CUT_MARGIN_TOKENS = 16


class PromptTokens(Protocol):
    name: str

    def tokens(self, payload: Mapping[str, Any] | None) -> Sequence[int] | None:
        """The prompt's token ids, or None when the body has no single prompt (a batch, no prompt)."""
        ...


def _prompt_ids(prompt: Any) -> Sequence[int] | None:
    """A completion prompt given as token ids (a list of ints, or a batch of one): its first
    `MAX_ROUTED_TOKENS`."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt:
        head = prompt[:MAX_ROUTED_TOKENS]
        if all(type(t) is int for t in head):
            return head
    return None


def _cut(text: str) -> tuple[str, bool]:
    """The start of `text` the router tokenizes, and whether anything was cut."""
    return (text[:MAX_ROUTED_CHARS], True) if len(text) > MAX_ROUTED_CHARS else (text, False)


def _uncut(ids: Sequence[int], cut: bool) -> Sequence[int]:
    """Token ids of a cut text less those the cut may have split otherwise; at most MAX_ROUTED_TOKENS."""
    if cut:
        ids = ids[: max(0, len(ids) - CUT_MARGIN_TOKENS)]
    return ids[:MAX_ROUTED_TOKENS]


def leading_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The messages whose text can fall within the rendered prompt's first `MAX_ROUTED_CHARS`
    characters, the last one's string content cut there; and whether anything was cut. A template
    places each message after the ones before it, so what lies past that many characters of content is
    past that many characters of the rendering."""
    kept: list[dict[str, Any]] = []
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and total + len(content) > MAX_ROUTED_CHARS:
            kept.append({**message, "content": content[: MAX_ROUTED_CHARS - total]})
            return kept, True
        kept.append(message)
        total += len(content) if isinstance(content, str) else 0
    return kept, False


def _single_text(prompt: Any) -> str | None:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


class SimPromptTokens:
    """As `corral sim` tokenizes: chat messages rendered by its template, then its toy tokenizer."""

    name = SIM_TOKENIZER

    def __init__(self) -> None:
        self._tokenizer = ToyTokenizer()

    def tokens(self, payload: Mapping[str, Any] | None) -> Sequence[int] | None:
        if payload is None:
            return None
        messages = payload.get("messages")
        if isinstance(messages, list):
            if not all(isinstance(m, dict) for m in messages):
                return None
            kept, cut = leading_messages(messages)
            rendered = render_chat(kept, payload.get("add_generation_prompt", True) is not False and not cut)
            text, cut_here = _cut(rendered)
            return _uncut(self._tokenizer.encode(text), cut or cut_here)
        prompt = payload.get("prompt")
        ids = _prompt_ids(prompt)
        if ids is not None:
            return ids
        single = _single_text(prompt)
        if single is None:
            return None
        text, cut = _cut(single)
        return _uncut(self._tokenizer.encode(text), cut)


class ModelPromptTokens:
    """A model's own tokenizer and chat template, as vLLM applies them (`transformers`)."""

    def __init__(self, source: str) -> None:
        try:
            from transformers import AutoTokenizer  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ValueError(
                f"--tokenizer {source!r} needs the `transformers` package, which is not installed; "
                f"install it (pip install transformers), or use --tokenizer {SIM_TOKENIZER} for "
                "`corral sim` engines, or leave --tokenizer out to route by approximate prefixes"
            ) from None
        try:
            self._tokenizer: Any = AutoTokenizer.from_pretrained(source)
        except Exception as exc:  # any loading failure is the same user error
            raise ValueError(
                f"--tokenizer {source!r}: cannot load a tokenizer from it ({exc}); give a model "
                "directory or name whose tokenizer the engines use"
            ) from None
        self.name = source

    def tokens(self, payload: Mapping[str, Any] | None) -> Sequence[int] | None:
        if payload is None:
            return None
        messages = payload.get("messages")
        if isinstance(messages, list):
            if not all(isinstance(m, dict) for m in messages):
                return None
            kept, cut = leading_messages(messages)
            try:
                # rendered, then tokenized without special tokens: what apply_chat_template(tokenize=True)
                # does, with the rendering cut first
                rendered = self._tokenizer.apply_chat_template(
                    kept,
                    tokenize=False,
                    add_generation_prompt=payload.get("add_generation_prompt", True) is not False and not cut,
                )
            except Exception:  # a body the template refuses is the engine's to reject
                return None
            text, cut_here = _cut(str(rendered))
            return _uncut(list(self._tokenizer.encode(text, add_special_tokens=False)), cut or cut_here)
        prompt = payload.get("prompt")
        ids = _prompt_ids(prompt)
        if ids is not None:
            return ids
        single = _single_text(prompt)
        if single is None:
            return None
        text, cut = _cut(single)
        return _uncut(list(self._tokenizer.encode(text)), cut)


def prompt_tokens(source: str | None) -> PromptTokens | None:
    """The tokenizer `--tokenizer` names; None when it names none (the KV index is then not used)."""
    if not source:
        return None
    if source == SIM_TOKENIZER:
        return SimPromptTokens()
    return ModelPromptTokens(source)
