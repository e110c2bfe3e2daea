"""Whether an engine's 200 answer to the smoke request is a real completion of the model asked: a
`text_completion` object naming that model, not an error body, with a choice whose text is not empty.
A 200 is not enough: a proxy, a middleware or another engine on the port can answer one."""

from __future__ import annotations

import orjson


class NotACompletion(ValueError):
    """The answer is something else; the message says what it was."""


def completion_of(raw: bytes, model: str) -> tuple[str, int | None]:
    """The text and completion tokens of `raw` when it is a completion of `model`, else
    NotACompletion saying what it was instead."""
    shown = f"{raw[:200]!r}"
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise NotACompletion(f"completion body is not JSON ({exc}): {shown}") from exc
    if not isinstance(body, dict):
        raise NotACompletion(f"completion body is not an object: {shown}")
    if "error" in body:
        raise NotACompletion(f"completion answered 200 with an error body: {shown}")
    if body.get("object") != "text_completion":
        raise NotACompletion(f"completion body's object is {body.get('object')!r}, not 'text_completion'")
    if body.get("model") != model:
        raise NotACompletion(
            f"completion came from model {body.get('model')!r}, not {model!r}: another engine answers?"
        )
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise NotACompletion(f"completion has no choices: {shown}")
    text = choices[0].get("text")
    if not isinstance(text, str) or not text:
        raise NotACompletion(f"completion returned empty text: {shown}")
    usage = body.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return text, tokens if isinstance(tokens, int) else None
