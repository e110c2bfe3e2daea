"""How a relayed vLLM SSE stream went, seen from the bytes a proxy passes through anyway: whether
generated tokens had reached the client (`tokens_emitted`), and how it ended: normally, with the
engine's own error event (`data: {"error": …}`), with a choice finished by the engine's abort
(`"finish_reason":"abort"`: a sleep, pause or shutdown with mode abort), or cut by the upstream
connection failing. The router (`corral_router_stream_failures_total`) and the supervisor's admission
gate (forced exits) both watch their streams with it.

A marker split across two chunks is still seen: the last bytes of a chunk are kept for the next.
This runs on every relayed chunk, so it never copies a whole chunk; the token check parses events
only until the first token has passed.
"""

from __future__ import annotations

from typing import Any

import orjson

ENGINE_ERROR = "engine_error"
ENGINE_ABORT = "engine_abort"
CUT = "cut"

# vLLM and the simulator write compact JSON; an error event's object starts with its "error" key.
_MARKERS = ((b'data: {"error"', ENGINE_ERROR), (b'"finish_reason":"abort"', ENGINE_ABORT))
_KEEP = max(len(marker) for marker, _ in _MARKERS) - 1
# An unfinished event this long before the first token is counted as carrying one: a client may have
# been sent tokens, and saying so is the safe side.
_UNDECIDED_LIMIT = 1 << 20
# What a streamed choice carries once the engine generated output: a completion's `text`, a chat
# delta's `content`, reasoning or tool calls. A chat stream's first chunk (the role) carries none.
_DELTA_OUTPUT = ("content", "reasoning_content", "reasoning", "tool_calls")


class FirstToken:
    """Fed every chunk of one SSE stream; `seen` once an event carrying generated output has passed."""

    def __init__(self) -> None:
        self.seen = False
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        if self.seen:
            return
        data = self._pending + chunk
        start = 0
        while not self.seen:
            end = data.find(b"\n\n", start)
            if end < 0:
                break
            self.seen = _carries_output(data[start:end])
            start = end + 2
        self._pending = b"" if self.seen else data[start:]
        if len(self._pending) > _UNDECIDED_LIMIT:
            self.seen, self._pending = True, b""


def _carries_output(event: bytes) -> bool:
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True  # not an event we know; the client got something
        if isinstance(parsed, dict) and any(_choice_output(c) for c in parsed.get("choices") or ()):
            return True
    return False


def _choice_output(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(delta.get(key) for key in _DELTA_OUTPUT)


class StreamEnding:
    """Fed every chunk of one stream; `failure` names how it failed, None while it looks normal, and
    `tokens_emitted` says whether generated output had passed."""

    def __init__(self) -> None:
        self.failure: str | None = None
        self._tail = b""
        self._first_token = FirstToken()

    @property
    def tokens_emitted(self) -> bool:
        return self._first_token.seen

    def feed(self, chunk: bytes) -> None:
        self._first_token.feed(chunk)
        if self.failure == ENGINE_ERROR:
            return  # the strongest verdict; nothing later changes it
        # the chunk itself, and the seam with the previous one: no copy of the whole chunk per chunk
        seam = self._tail + chunk[:_KEEP]
        for marker, failure in _MARKERS:
            if marker in chunk or marker in seam:
                self.failure = failure
                if failure == ENGINE_ERROR:
                    return
        self._tail = chunk[-_KEEP:] if len(chunk) >= _KEEP else (self._tail + chunk)[-_KEEP:]

    def cut(self) -> None:
        self.failure = CUT
