"""How `corral sim` renders a chat: OpenAI `messages` into one prompt string, in order (a Llama-like
template). A fact about that engine, below both its readers: the simulator's chat endpoint renders with
it, and the router's `--tokenizer sim` renders the same prompt to tokenize."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def message_text(content: Any) -> str:
    """The text of a `content`: a string, a list of `{"type": "text", "text": ...}` parts, or null."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part
        )
    return str(content)


def render_chat(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    parts = [f"<|{m.get('role', 'user')}|>\n{message_text(m.get('content'))}\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
