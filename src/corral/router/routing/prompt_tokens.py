"""The token ids an engine will prefill for a request, computed in the router so that its blocks can be
compared with the blocks the engines report in their KV events (`--tokenizer`): `sim` tokenizes as
`corral sim` does (its chat rendering and toy tokenizer); a path or model name loads that model's
tokenizer and chat template with `transformers`, when it is installed (an optional dependency)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from corral.sim.core.chat import render_chat
from corral.sim.core.tokenizer import ToyTokenizer

SIM_TOKENIZER = "sim"


class PromptTokens(Protocol):
    name: str

    def tokens(self, payload: Mapping[str, Any] | None) -> Sequence[int] | None:
        """The prompt's token ids, or None when the body has no single prompt (a batch, no prompt)."""
        ...


def _prompt_ids(prompt: Any) -> Sequence[int] | None:
    """A completion prompt given as token ids (a list of ints, or a batch of one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


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
            rendered = render_chat(messages, payload.get("add_generation_prompt", True) is not False)
            return self._tokenizer.encode(rendered)
        prompt = payload.get("prompt")
        ids = _prompt_ids(prompt)
        if ids is not None:
            return ids
        text = _single_text(prompt)
        return None if text is None else self._tokenizer.encode(text)


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
            try:
                ids = self._tokenizer.apply_chat_template(
                    messages,
                    tokenize=True,
                    add_generation_prompt=payload.get("add_generation_prompt", True) is not False,
                )
            except Exception:  # a body the template refuses is the engine's to reject
                return None
            return list(ids)
        prompt = payload.get("prompt")
        ids = _prompt_ids(prompt)
        if ids is not None:
            return ids
        text = _single_text(prompt)
        return None if text is None else list(self._tokenizer.encode(text))


def prompt_tokens(source: str | None) -> PromptTokens | None:
    """The tokenizer `--tokenizer` names; None when it names none (the KV index is then not used)."""
    if not source:
        return None
    if source == SIM_TOKENIZER:
        return SimPromptTokens()
    return ModelPromptTokens(source)
