"""Writes the golden KV-event files from vLLM's own code; run with vLLM's Python (see README.md)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import msgspec
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash, maybe_convert_block_hash

HERE = Path(__file__).parent
# Ids below 24, below 256, below 65536 and above: every width an integer takes in CBOR.
TOKENS = [5, 200, *((i * 104729) % 152000 for i in range(98))]
BLOCK_SIZE = 16


def batches() -> dict[str, KVEventBatch]:
    stored = BlockStored(
        block_hashes=[1, 2**64 - 1],
        parent_block_hash=None,
        token_ids=list(range(32)),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )
    stored_lora = BlockStored(
        block_hashes=[12345678901234567890],
        parent_block_hash=2**64 - 1,
        token_ids=list(range(32, 48)),
        block_size=16,
        lora_id=3,
        medium="GPU",
        lora_name="sql-lora",
        extra_keys=[("sql-lora", "salt")],
        group_idx=0,
        session_id="s-1",
    )
    removed = BlockRemoved(block_hashes=[1, 2**64 - 1], medium="GPU", group_idx=0)
    as_bytes = BlockStored(
        block_hashes=[b"\x01" * 32],
        parent_block_hash=b"\x02" * 32,
        token_ids=[5, 6],
        block_size=2,
        lora_id=None,
        medium="CPU",
        lora_name=None,
    )
    return {
        "batch_int": KVEventBatch(
            ts=1764800000.25, events=[stored, stored_lora, removed, AllBlocksCleared()], data_parallel_rank=0
        ),
        "batch_bytes": KVEventBatch(
            ts=2.5, events=[as_bytes, BlockRemoved(block_hashes=[b"\x01" * 32], medium=None)]
        ),
    }


def hash_cases() -> list[dict]:
    cases = []
    lora = ("lora", "sql-lora", "/adapters/sql")
    specs = [
        ("sha256", None, None),
        ("sha256", "0", None),
        ("sha256_cbor", None, None),
        ("sha256_cbor", "42", None),
        ("sha256", None, [(lora, ("cache_salt", "tenant-a"))] + [(lora,)] * 5),
        ("sha256_cbor", "7", [(lora, ("cache_salt", "tenant-a"))] + [(lora,)] * 5),
    ]
    for algo, seed, extra in specs:
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        fn = get_hash_fn_by_name(algo)
        init_none_hash(fn)
        parent = None
        digests = []
        for i, start in enumerate(range(0, len(TOKENS) - BLOCK_SIZE + 1, BLOCK_SIZE)):
            keys = extra[i] if extra else None
            parent = hash_block_tokens(fn, parent, TOKENS[start : start + BLOCK_SIZE], keys)
            digests.append(parent)
        cases.append(
            {
                "algo": algo,
                "seed": seed,
                "extra_keys": extra,
                "none_hash": kv_cache_utils.NONE_HASH.hex(),
                "digests": [d.hex() for d in digests],
                "event_hashes": [maybe_convert_block_hash(d) for d in digests],
            }
        )
    return cases


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wire(batch_list: list[KVEventBatch]) -> dict:
    """Frames vLLM's publisher sends: published, then a replay from seq 1."""
    pub_port, replay_port = free_port(), free_port()
    publisher = ZmqEventPublisher(
        0, endpoint=f"tcp://*:{pub_port}", replay_endpoint=f"tcp://*:{replay_port}", topic="kv@engine-a"
    )
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 10000)
    sub.connect(f"tcp://127.0.0.1:{pub_port}")
    time.sleep(0.5)
    for batch in batch_list:
        publisher.publish(batch)
    published = [sub.recv_multipart() for _ in batch_list]
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10000)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    replayed = []
    while True:
        frames = dealer.recv_multipart()
        replayed.append(frames)
        if frames[2] == (-1).to_bytes(8, "big", signed=True):
            break
    publisher.shutdown()
    return {
        "published": [[f.hex() for f in m] for m in published],
        "replay_request": [b"".hex(), (1).to_bytes(8, "big").hex()],
        "replayed": [[f.hex() for f in m] for m in replayed],
    }


def main() -> None:
    encoder = msgspec.msgpack.Encoder()
    made = batches()
    for name, batch in made.items():
        (HERE / f"{name}.msgpack").write_bytes(encoder.encode(batch))
    (HERE / "block_hashes.json").write_text(
        json.dumps({"block_size": BLOCK_SIZE, "token_ids": TOKENS, "cases": hash_cases()}, indent=1) + "\n"
    )
    os.environ.pop("PYTHONHASHSEED", None)
    (HERE / "zmq_frames.json").write_text(json.dumps(wire(list(made.values())), indent=1) + "\n")
    print("wrote", sorted(p.name for p in HERE.iterdir()), file=sys.stderr)


if __name__ == "__main__":
    main()
