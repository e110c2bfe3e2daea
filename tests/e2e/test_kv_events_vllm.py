"""Real vLLM (CPU build) with `--kv-events-config` on the shared engine: what it publishes decodes with
`corral.engine.kv_events`, encodes back to the same bytes, and carries exactly the block hashes
`block_hashes` computes for the prompt's tokens with the engine's seed; its replay socket answers as the
simulator's does."""

from __future__ import annotations

import os
import time

import httpx
import pytest
import zmq

from corral.engine.kv_events import (
    REPLAY_END_SEQ,
    BlockStored,
    KVEventBatch,
    block_hashes,
    decode_batch,
    encode_batch,
    parse_published,
    seq_frame,
)
from tests.e2e.conftest import SERVED_NAME, VllmKvEvents

pytestmark = pytest.mark.e2e


def _replay(ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> list[tuple[int, bytes, KVEventBatch]]:
    """Every batch the engine still buffers, from seq 0, as (seq, payload, batch)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 30_000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    dealer.send_multipart([b"", seq_frame(0)])
    got: list[tuple[int, bytes, KVEventBatch]] = []
    try:
        while True:
            empty, *frames = dealer.recv_multipart()
            assert empty == b""
            if frames[1] == REPLAY_END_SEQ:
                assert frames == [b"", REPLAY_END_SEQ, b""]
                return got
            _, seq, payload = parse_published(frames)
            got.append((seq, payload, decode_batch(payload)))
    finally:
        dealer.close()


def test_vllm_events_carry_block_hashes_of_the_prompt(vllm_engine: str, vllm_kv_events: VllmKvEvents) -> None:
    tag = f"kv events {time.monotonic_ns()}: "
    prompt = tag + "the tide rises and falls twice a day, pulled by the moon and the sun. " * 4
    with httpx.Client(timeout=120.0) as client:
        tokens = client.post(vllm_engine + "/tokenize", json={"model": SERVED_NAME, "prompt": prompt}).json()
        ids: list[int] = tokens["tokens"]
        answer = client.post(
            vllm_engine + "/v1/completions",
            json={"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0},
        )
        assert answer.status_code == 200
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        deadline = time.monotonic() + 60
        mine: list[BlockStored] = []
        while not mine and time.monotonic() < deadline:  # the step's batch may still be on its way
            batches = _replay(ctx, vllm_kv_events.replay)
            assert [seq for seq, _, _ in batches] == list(range(len(batches)))
            for _, payload, batch in batches:
                assert encode_batch(batch) == payload  # vLLM's bytes, re-made by our classes
                assert batch.data_parallel_rank == 0
            stored = [e for _, _, b in batches for e in b.events if isinstance(e, BlockStored)]
            mine = [
                e for e in stored if e.parent_block_hash is None and e.token_ids == ids[: len(e.token_ids)]
            ]
            if not mine:
                time.sleep(0.5)
    finally:
        ctx.term()
    assert mine, "no BlockStored for the prompt's first blocks"
    event = mine[-1]
    block = event.block_size
    expected = block_hashes(ids, block, seed=os.environ.get("PYTHONHASHSEED"))
    assert event.block_hashes == expected[: len(event.block_hashes)]
    assert len(event.block_hashes) == len(event.token_ids) // block >= 1
    assert event.medium == "GPU" and event.lora_id is None and event.group_idx == 0
