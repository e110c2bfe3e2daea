"""`kv_transfer_params` belongs to the router alone: what the data path strips from clients' bodies and
from the answers it relays to them, and the byte bounds on the engine answers it reads to do so.

A client's `kv_transfer_params` would let it steer a NIXL engine (`do_remote_decode` pins blocks and
returns the engine's id, side-channel host/port and block ids; `do_remote_prefill` with a host/port makes
the engine pull from a host of the client's choosing), so it is dropped from every client body; only the
router's own P/D legs (corral.router.datapath.pd) set it. An engine's answer carrying params (vLLM writes
`"kv_transfer_params":null` in every non-streamed chat and completion answer; params only when the request
asked for a remote decode) has them set to null before a client sees it, in a whole answer and in an SSE
line. Every check starts with a substring search: an answer without the key costs that search only.
"""

from __future__ import annotations

from typing import Any

import orjson

from corral.engine.pd_protocol import TRANSFER_PARAMS

KEY = TRANSFER_PARAMS.encode()
# What vLLM writes in an answer to a request that asked for no transfer: nothing to strip.
_NULL = b'"' + KEY + b'":null'
_SEAM = len(KEY) - 1

# Bounds on what an engine sends that the router reads whole (bytes).
# A prefill leg's answer: one generated token and the params (a block id list per KV-cache group: ~40 KB
# for a 100k-token prompt); prompt logprobs a client asked for ride along, hence the margin.
MAX_PREFILL_ANSWER_BYTES = 4 << 20
# A non-streamed answer relayed to a client (read whole to strip params; was unbounded). Over it, the
# client gets a 502 that says to stream: embeddings of large batches fit, a hostile engine's flood does not.
MAX_ANSWER_BYTES = 64 << 20
# An SSE line held back until its newline (so params in it can be stripped). A longer line is relayed in
# pieces as it comes, its last bytes held back; params found in such a line end the stream with an error.
MAX_SSE_LINE_BYTES = 1 << 20


class AnswerTooLarge(Exception):
    """An engine's answer that the router reads whole ran past its bound."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer over {limit} bytes")
        self.limit = limit


class UnstrippableStream(Exception):
    """An SSE line too long to hold carried kv_transfer_params: the stream cannot go on cleanly."""


def strip_request(payload: dict[str, Any]) -> bool:
    """Drop the client's top-level kv_transfer_params from its parsed body; whether there was one."""
    if TRANSFER_PARAMS in payload:
        del payload[TRANSFER_PARAMS]
        return True
    return False


def _carries(data: bytes) -> bool:
    """Whether `data` may carry params other than vLLM's null (every occurrence of the key is the null)."""
    count = data.count(KEY)
    return count > 0 and count != data.count(_NULL)


def strip_answer(body: bytes) -> bytes:
    """A whole JSON answer with its top-level kv_transfer_params set to null (unchanged bytes when it
    carries none, or is not a JSON object: then the key is only text in it)."""
    if KEY not in body or not _carries(body):
        return body
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(parsed, dict) or parsed.get(TRANSFER_PARAMS) is None:
        return body
    parsed[TRANSFER_PARAMS] = None
    return orjson.dumps(parsed)


def _strip_line(line: bytes) -> bytes:
    """One complete SSE line (its newline included) without params: a `data:` event's JSON object gets
    null params; any other line naming the key is dropped whole."""
    if not line.startswith(b"data:"):
        return b""
    body = line[5:].strip()
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return b""
    if not isinstance(parsed, dict):
        return b""
    if parsed.get(TRANSFER_PARAMS) is None:
        return line  # null, or the name only as text deeper in (a token's content)
    parsed[TRANSFER_PARAMS] = None
    return b"data: " + orjson.dumps(parsed) + b"\n"


def _strip_lines(block: bytes) -> bytes:
    """Whole SSE lines, each that may carry params rewritten."""
    if not _carries(block):
        return block
    lines = block.splitlines(keepends=True)
    return b"".join(_strip_line(line) if _carries(line) else line for line in lines)


class SseParamsFilter:
    """Fed each chunk of a relayed SSE answer, returns the bytes to send on: whole lines, params stripped.

    The fast path (no held bytes, a chunk that ends a line and names no key) returns the chunk itself.
    An unfinished line is held until its newline, up to MAX_SSE_LINE_BYTES; past that the line is sent on
    as it comes (its last bytes held back to see a key on the seam), and a key in it raises
    UnstrippableStream.
    """

    __slots__ = ("_held", "_long", "limit")

    def __init__(self, limit: int = MAX_SSE_LINE_BYTES) -> None:
        self._held = b""
        self._long = False  # part of the line being held was already sent on
        self.limit = limit

    def feed(self, chunk: bytes) -> bytes:
        if not self._held and chunk.endswith(b"\n") and KEY not in chunk:
            return chunk
        data = self._held + chunk
        out = b""
        if self._long:  # the rest of a long line first: it can no longer be rewritten
            newline = data.find(b"\n") + 1
            if KEY in (data[:newline] if newline else data):
                raise UnstrippableStream(f"an SSE line over {self.limit} bytes carries kv_transfer_params")
            if not newline:
                return self._hold_long(data)
            self._long = False
            out, data = data[:newline], data[newline:]
        end = data.rfind(b"\n") + 1
        done, self._held = data[:end], data[end:]
        out += _strip_lines(done) if KEY in done else done
        if len(self._held) > self.limit:
            if KEY in self._held:
                raise UnstrippableStream(f"an SSE line over {self.limit} bytes carries kv_transfer_params")
            self._long = True
            out += self._hold_long(self._held)
        return out

    def _hold_long(self, data: bytes) -> bytes:
        """Send on all of a long line but its last bytes (a key may straddle the next chunk)."""
        self._held = data[-_SEAM:]
        return data[:-_SEAM]

    def finish(self) -> bytes:
        """What is left when the stream ends (an unterminated last line)."""
        held, self._held = self._held, b""
        if self._long:
            if KEY in held:
                raise UnstrippableStream(f"an SSE line over {self.limit} bytes carries kv_transfer_params")
            return held
        return _strip_lines(held) if KEY in held else held
