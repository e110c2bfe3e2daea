"""How a relayed SSE stream ended, seen from the bytes the router passes through anyway: normally, with
the engine's own error event (`data: {"error": …}`), with a choice finished by the engine's abort
(`"finish_reason":"abort"`: a sleep, pause or shutdown with mode abort), or cut by the upstream
connection failing. Counted by the router (`corral_router_stream_failures_total`) for `corral doctor`.

A marker split across two chunks is still seen: the last bytes of a chunk are kept for the next.
This runs on every relayed chunk, so it never copies a whole chunk.
"""

from __future__ import annotations

ENGINE_ERROR = "engine_error"
ENGINE_ABORT = "engine_abort"
CUT = "cut"

# vLLM and the simulator write compact JSON; an error event's object starts with its "error" key.
_MARKERS = ((b'data: {"error"', ENGINE_ERROR), (b'"finish_reason":"abort"', ENGINE_ABORT))
_KEEP = max(len(marker) for marker, _ in _MARKERS) - 1


class StreamEnding:
    """Fed every chunk of one stream; `failure` names how it failed, None while it looks normal."""

    def __init__(self) -> None:
        self.failure: str | None = None
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
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
