"""`corral sim --kv-events-config`: a real simulator publishes its prefix cache's changes as vLLM's KV events
on ZMQ; a subscriber here decodes them with `corral.engine.kv_events` and checks the hashes, the eviction,
the reset and the replay socket."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from corral.engine.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_hashes,
    decode_batch,
    parse_published,
    seq_frame,
)
from tests.support.procs import CorralProcess, free_port

SEED = "1234"
BLOCK = 16
TOPIC = b"kv@sim"


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10.0) as resp:
        return orjson.loads(resp.read())


class Subscriber:
    """A SUB socket on the sim's events and a DEALER on its replay socket."""

    def __init__(self, pub: str, replay: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVTIMEO, 10_000)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.sub.setsockopt(zmq.RECONNECT_IVL, 20)
        self.monitor = self.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.monitor.setsockopt(zmq.RCVTIMEO, 30_000)
        self.sub.connect(pub)
        self.replay_address = replay

    def wait_connected(self) -> None:
        """Until the SUB socket has met the publisher (its subscription follows at once)."""
        recv_monitor_message(self.monitor)

    def next_batch(self) -> tuple[int, KVEventBatch]:
        topic, seq, payload = parse_published(self.sub.recv_multipart())
        assert topic == TOPIC
        return seq, decode_batch(payload)

    def replay(self, start: int) -> list[tuple[int, KVEventBatch]]:
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_address)
        dealer.send_multipart([b"", seq_frame(start)])
        got: list[tuple[int, KVEventBatch]] = []
        try:
            while True:
                empty, *frames = dealer.recv_multipart()
                assert empty == b""
                if frames[1] == REPLAY_END_SEQ:
                    assert frames == [b"", REPLAY_END_SEQ, b""]
                    return got
                topic, seq, payload = parse_published(frames)
                assert topic == TOPIC
                got.append((seq, decode_batch(payload)))
        finally:
            dealer.close()

    def close(self) -> None:
        self.sub.disable_monitor()
        self.monitor.close()
        self.sub.close()
        self.ctx.term()


@pytest.fixture
def sim() -> Iterator[tuple[str, Subscriber]]:
    port, pub, replay = free_port(), free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": TOPIC.decode(),
    }
    proc = CorralProcess(
        [
            "sim", "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK),
            "--kv-cache-blocks", "10", "--max-num-seqs", "4", "--kv-events-config", json.dumps(config),
        ],
        env={"PYTHONHASHSEED": SEED, "VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip
    subscriber = Subscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/health")
        subscriber.wait_connected()
        yield url, subscriber
    finally:
        subscriber.close()
        proc.stop()


def _complete(url: str, prompt: str | list[int]) -> None:
    _post(url, "/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 1})


def _events(batches: list[tuple[int, KVEventBatch]]) -> list[Any]:
    return [e for _, b in batches for e in b.events]


def test_cache_changes_are_published_as_vllm_events(sim: tuple[str, Subscriber]) -> None:
    url, subscriber = sim
    # A text prompt: the blocks its tokens fill, hashed as vLLM hashes them with the engine's seed.
    text = "The tide rises and falls twice a day, pulled by the moon and the sun. " * 2
    tokens = _post(url, "/tokenize", {"model": "sim-model", "prompt": text})["tokens"]
    assert 2 * BLOCK <= len(tokens) <= 10 * BLOCK
    _complete(url, text)
    seq, live = subscriber.next_batch()
    replayed = subscriber.replay(0)
    assert [s for s, _ in replayed] == list(range(seq + 1))
    (stored,) = _events(replayed)
    assert isinstance(stored, BlockStored)
    expected = block_hashes(tokens, BLOCK, seed=SEED)
    assert stored.block_hashes == expected and len(expected) == len(tokens) // BLOCK
    assert stored.parent_block_hash is None
    assert stored.token_ids == tokens[: len(expected) * BLOCK]
    assert (stored.block_size, stored.lora_id, stored.lora_name, stored.medium) == (BLOCK, None, None, "GPU")
    assert stored.extra_keys == [None] * len(expected) and stored.group_idx == 0
    assert live.events == [stored] and live.data_parallel_rank == 0

    _post(url, "/reset_prefix_cache", {})
    _, batch = subscriber.next_batch()
    assert batch.events == [AllBlocksCleared()]

    first = list(range(1000, 1000 + 5 * BLOCK + 3))  # five full blocks and three tokens
    second = [t + 100 for t in first]
    third = [t + 200 for t in first]
    _complete(url, first)
    _, batch = subscriber.next_batch()
    hashes = block_hashes(first, BLOCK, seed=SEED)
    assert [e.block_hashes for e in batch.events if isinstance(e, BlockStored)] == [hashes]

    # The same first blocks, then new ones: stored from where the cache stopped, with their parent.
    branch = first[: 3 * BLOCK] + second[3 * BLOCK :]
    _complete(url, branch)
    _, batch = subscriber.next_batch()
    (more,) = batch.events
    assert isinstance(more, BlockStored)
    chained = block_hashes(branch, BLOCK, seed=SEED)
    assert more.parent_block_hash == hashes[2] == chained[2]
    assert more.block_hashes == chained[3:] and more.token_ids == branch[3 * BLOCK : 5 * BLOCK]

    # Seven of ten blocks are held; each prompt of five more evicts the least recently used, one event
    # each: the first prompt's last two blocks, then (the cache full) its first three and the branch's two.
    _complete(url, second)
    _complete(url, third)
    events = _events([subscriber.next_batch(), subscriber.next_batch()])
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert all(len(e.block_hashes) == 1 and e.medium == "GPU" for e in removed)
    assert [e.block_hashes[0] for e in removed] == [*hashes[3:], *hashes[:3], *chained[3:]]
    stored_now = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored_now == block_hashes(second, BLOCK, seed=SEED) + block_hashes(third, BLOCK, seed=SEED)

    # A replay from a later seq answers the batches from there, then the end marker.
    assert [s for s, _ in subscriber.replay(seq + 3)] == [seq + 3, seq + 4, seq + 5]
