"""A compromised engine's KV-event publisher for tests and benchmarks: a ZMQ PUB and a replay ROUTER
speaking vLLM's framing (`corral.engine.kv_events`), sending whatever payloads it is given, hostile or
not. It runs in a thread of its own; `publish` buffers a payload (for replays) and sends it live."""

from __future__ import annotations

import threading
from typing import Any

import msgspec
import zmq

from corral.engine.kv_events import REPLAY_END_SEQ, parse_seq, seq_frame


def stored_event(
    hashes: list[Any], tokens: list[int], block_size: int, parent: Any = None, lora: str | None = None
) -> dict[str, Any]:
    """A BlockStored event as a map, so fields can hold what vLLM's classes would not build."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": lora,
    }


def batch_payload(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


def nested_payload(depth: int) -> bytes:
    """A BlockStored whose extra_keys nest `depth` arrays deep (past the decoder's recursion limit)."""
    event = stored_event([7], list(range(16)), 16)
    event["extra_keys"] = ["HOLE"]
    return batch_payload(event).replace(msgspec.msgpack.encode("HOLE"), b"\x91" * depth + b"\xa1x")


class HostilePublisher:
    """PUB at `pub_port`, replay ROUTER at `replay_port`, on 127.0.0.1."""

    def __init__(self, pub_port: int, replay_port: int) -> None:
        self.address = f"tcp://127.0.0.1:{pub_port},tcp://127.0.0.1:{replay_port}"
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        self._pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self._replay = self._ctx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self._replay.bind(f"tcp://127.0.0.1:{replay_port}")
        self._buffer: list[bytes] = []
        self._outbox: list[bytes] = []
        self._lock = threading.Lock()
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.bind(f"inproc://hostile-{id(self)}")
        self._waker = self._ctx.socket(zmq.PAIR)
        self._waker.connect(f"inproc://hostile-{id(self)}")
        self.replays = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hostile-kv-publisher", daemon=True)
        self._thread.start()

    def publish(self, payload: bytes) -> int:
        """Buffer `payload` and send it live; its sequence number."""
        with self._lock:
            self._outbox.append(payload)
            seq = len(self._buffer) + len(self._outbox) - 1
        self._waker.send(b"")
        return seq

    def clear(self) -> None:
        """Forget the buffered payloads (a replay then brings nothing older)."""
        with self._lock:
            self._buffer = [b""] * len(self._buffer)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake, zmq.POLLIN)
        poller.register(self._replay, zmq.POLLIN)
        while not self._stop:
            ready = dict(poller.poll(200))
            if self._wake in ready:
                self._wake.recv()
                with self._lock:
                    out, self._outbox = self._outbox, []
                    for payload in out:
                        self._pub.send_multipart([b"", seq_frame(len(self._buffer)), payload])
                        self._buffer.append(payload)
            if self._replay in ready:
                identity, _, start = self._replay.recv_multipart()
                self.replays += 1
                with self._lock:
                    for seq in range(max(0, parse_seq(start)), len(self._buffer)):
                        if self._buffer[seq]:
                            self._replay.send_multipart(
                                [identity, b"", b"", seq_frame(seq), self._buffer[seq]]
                            )
                self._replay.send_multipart([identity, b"", b"", REPLAY_END_SEQ, b""])

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)
