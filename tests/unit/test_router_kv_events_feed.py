"""The router's subscription to one engine's KV events, against a real ZMQ publisher speaking vLLM's
framing and replay protocol on loopback: replay on connect, a sequence gap repaired by replay, a new
engine process (its sequence starting over) clearing the engine's blocks, and the feed stopped when
the endpoint leaves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from corral.engine.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    block_hashes,
    decode_batch,
    encode_batch,
    seq_frame,
)
from corral.engine.kv_events_address import parse_address
from corral.engine_state import EngineState
from corral.fleet.local.ports import free_port
from corral.router.discovery.kv_events_feed import KvEventFeeds, apply_batch
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.routing.kv_index import KvIndex, content_chain

BS = 4


def _port() -> int:
    return free_port("127.0.0.1")


class Publisher:
    """An engine's publisher as vLLM runs it: PUB (topic, seq, payload) and a ROUTER replay socket
    answering from its buffer; `skip` publishes a batch to the buffer only (a message the SUB lost).
    The PUB is an XPUB (the same frames on the wire to a SUB) so that a test can wait for the router's
    subscription to arrive instead of sleeping: ZMQ drops what a PUB sends before that."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.pub_port, self.replay_port = _port(), _port()
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every SUB's subscription, not only a topic's first
        self.pub.bind(f"tcp://127.0.0.1:{self.pub_port}")
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replays_served = 0
        self._task = asyncio.create_task(self._serve_replay())

    @property
    def address(self) -> str:
        return f"tcp://*:{self.pub_port},tcp://*:{self.replay_port}"

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.replay.send_multipart([client, b"", b"", seq_frame(seq), payload])
            await self.replay.send_multipart([client, b"", b"", REPLAY_END_SEQ, b""])
            self.replays_served += 1

    async def publish(self, *events: object, skip: bool = False) -> None:
        payload = encode_batch(KVEventBatch(ts=time.time(), events=list(events)))
        self.buffer.append((self.seq, payload))
        if not skip:
            await self.pub.send_multipart([b"", seq_frame(self.seq), payload])
        self.seq += 1

    async def subscribed(self) -> None:
        """Wait for the next SUB's subscription to reach the publisher: what it publishes from then on
        reaches that SUB."""
        deadline = time.monotonic() + 10.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no SUB subscribed to the publisher")
            frame = await asyncio.wait_for(self.pub.recv(), left)
            if frame[:1] == b"\x01":
                return

    def restart(self) -> None:
        """A new engine process: its sequence and buffer start over."""
        self.seq = 0
        self.buffer = []

    async def close(self) -> None:
        self._task.cancel()
        self.pub.close(linger=0)
        self.replay.close(linger=0)


def stored(tokens: list[int], first: int = 0) -> BlockStored:
    hashes = block_hashes(tokens, BS, seed="engine")
    return BlockStored(
        block_hashes=hashes[first:],
        parent_block_hash=hashes[first - 1] if first else None,
        token_ids=tokens[first * BS : len(hashes) * BS],
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


async def eventually(check: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


Rig = tuple[Publisher, KvEventFeeds, list[Endpoint]]


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    ctx = zmq.asyncio.Context()
    publisher = Publisher(ctx)
    endpoint = Endpoint("http://127.0.0.1:9", state=EngineState.READY, kv_events=publisher.address)
    members = [endpoint]
    feeds = KvEventFeeds(KvIndex(), lambda: list(members), sync_seconds=0.05)
    try:
        yield publisher, feeds, members
    finally:
        await feeds.stop()
        await publisher.close()
        ctx.destroy(linger=0)


def held(feeds: KvEventFeeds, tokens: list[int]) -> int:
    return feeds.index.longest(content_chain(tokens, BS)).get("http://127.0.0.1:9", 0)


A = list(range(4 * BS))
B = list(range(100, 100 + 3 * BS))


async def test_blocks_published_before_the_router_subscribed_come_by_replay(rig: Rig) -> None:
    publisher, feeds, _ = rig
    await publisher.publish(stored(A))  # nobody listens yet
    await feeds.start()
    await eventually(lambda: held(feeds, A) == 4, "the replay brought block A")
    status = feeds.to_json("http://127.0.0.1:9")
    assert status is not None and status["replays"] >= 1 and status["index"]["blocks"] == 4


async def test_a_sequence_gap_is_repaired_by_replay(rig: Rig) -> None:
    publisher, feeds, _ = rig
    await feeds.start()
    await eventually(lambda: publisher.replays_served == 1, "the first replay")
    await publisher.subscribed()
    await publisher.publish(stored(B))
    await eventually(lambda: held(feeds, B) == 3, "the live batch")
    await publisher.publish(stored(A[: 2 * BS]), skip=True)  # lost on the way
    await publisher.publish(stored(A, first=2))  # its parent is in the lost batch
    await eventually(lambda: held(feeds, A) == 4, "the gap replayed, then the live batch")
    status = feeds.to_json("http://127.0.0.1:9")
    assert status is not None and status["gaps"] == 1 and status["lost"] == 0


async def test_a_new_engine_process_clears_what_the_old_one_held(rig: Rig) -> None:
    publisher, feeds, _ = rig
    await feeds.start()
    await eventually(lambda: publisher.replays_served == 1, "the first replay")
    await publisher.subscribed()
    for tokens in (A, B):
        await publisher.publish(stored(tokens))
    await eventually(lambda: held(feeds, B) == 3, "both stored")
    publisher.restart()
    await publisher.publish(stored(B[:BS]))  # seq 0 again
    await eventually(lambda: held(feeds, B) == 1, "the old process's blocks forgotten")
    assert held(feeds, A) == 0
    status = feeds.to_json("http://127.0.0.1:9")
    assert status is not None and status["restarts"] == 1


async def test_all_blocks_cleared_and_leaving_membership(rig: Rig) -> None:
    publisher, feeds, members = rig
    await publisher.publish(stored(A))
    await feeds.start()
    await eventually(lambda: held(feeds, A) == 4, "stored")
    await publisher.subscribed()
    await publisher.publish(AllBlocksCleared())
    await eventually(lambda: held(feeds, A) == 0, "cleared")
    members.clear()
    await eventually(lambda: not feeds.publishing("http://127.0.0.1:9"), "unsubscribed once it left")
    assert not feeds.index.indexes("http://127.0.0.1:9")


def test_a_wildcard_bind_is_reached_on_the_engines_host() -> None:
    address = parse_address("tcp://*:5557,tcp://0.0.0.0:5558", "10.1.2.3")
    assert (address.endpoint, address.replay) == ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558")
    assert parse_address("tcp://*:5557", "fd00::1").endpoint == "tcp://[fd00::1]:5557"
    with pytest.raises(ValueError, match="no port"):
        parse_address("tcp://host", "h")
    with pytest.raises(ValueError, match="not a ZMQ address"):
        parse_address("http://h:1", "h")


async def test_a_replay_socket_that_never_answers_does_not_stop_the_live_stream(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, feeds, members = rig
    monkeypatch.setattr("corral.router.discovery.kv_events_feed.REPLAY_TIMEOUT_SECONDS", 0.3)
    members[0].kv_events = f"tcp://*:{publisher.pub_port},tcp://*:{_port()}"  # nothing listens there
    await feeds.start()
    await publisher.subscribed()
    await publisher.publish(stored(B))  # waits in the SUB's queue while the replay is asked for
    await eventually(lambda: held(feeds, B) == 3, "the live batch, after the replay gave up")
    status = feeds.to_json("http://127.0.0.1:9")
    assert status is not None and status["replays"] == 0, status


def test_a_batch_vllm_itself_encoded_is_indexed() -> None:
    # tests/data/kv_events: bytes made by vLLM 0.32's own classes (int hashes up to 2**64 - 1)
    data = Path(__file__).resolve().parents[1] / "data" / "kv_events"
    batch = decode_batch((data / "batch_int.msgpack").read_bytes())
    index = KvIndex()
    first = KVEventBatch(ts=batch.ts, events=batch.events[:1])
    apply_batch(index, "http://e:1", first)
    assert index.longest(content_chain(list(range(32)), 16)) == {"http://e:1": 2}
    apply_batch(index, "http://e:1", batch)  # ... then removed, then all cleared
    assert index.blocks == 0
    # another tier's blocks (medium CPU) are not what a prefill finds on the GPU: not indexed
    apply_batch(index, "http://e:1", decode_batch((data / "batch_bytes.msgpack").read_bytes()))
    assert index.blocks == 0


async def test_a_new_prefix_epoch_forgets_the_engine_and_subscribes_again(rig: Rig) -> None:
    publisher, feeds, members = rig
    members[0].supervisor = SupervisorView("http://s", prefix_epoch="1")
    await feeds.start()
    await eventually(lambda: publisher.replays_served == 1, "the first replay")
    await publisher.subscribed()
    await publisher.publish(stored(A))
    await eventually(lambda: held(feeds, A) == 4, "stored")
    publisher.buffer.clear()  # the engine's cache was emptied: nothing to replay
    members[0].supervisor.prefix_epoch = "2"
    await eventually(lambda: publisher.replays_served == 2, "subscribed again")
    assert held(feeds, A) == 0


async def test_batches_between_the_connect_replay_and_the_first_live_one_come_by_replay(rig: Rig) -> None:
    publisher, feeds, _ = rig
    await feeds.start()
    await eventually(lambda: publisher.replays_served == 1, "the replay on connect, empty")
    await publisher.subscribed()
    await publisher.publish(stored(A[: 2 * BS]), skip=True)  # published before the SUB had joined
    await publisher.publish(stored(A, first=2))
    await eventually(lambda: held(feeds, A) == 4, "seq 0 replayed before seq 1 applied")
