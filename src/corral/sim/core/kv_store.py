"""The shared KV store of a simulated storage connector (vLLM's ExampleConnector): each computed prompt is
saved under `shared_storage_path` in a folder named by the hash of its tokens, and any engine on that path
loads a later prompt's KV from there when the folder of that prompt's tokens exists.

Facts from vLLM 0.32 (kv_connector/v1/example_connector.py): the folder is the md5 (`safe_hash`) hex of the
token ids as int64 bytes; a prompt of n tokens is saved as its first `(n - 1) // block * block` tokens and
looked up as its first `(n - 2) // block * block` (the connector assumes a prompt is a stored one plus one
token); a hit loads that many tokens less those the local prefix cache already holds, whatever the engine's
kv_role. The sim writes an empty folder where vLLM writes one safetensors file per layer.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Sequence

DEFAULT_PATH = "/tmp"  # vLLM's default shared_storage_path


def aligned(tokens: int, block_size: int) -> int:
    """vLLM's align_to_block_size: the whole blocks of `tokens - 1` tokens."""
    return max(0, (tokens - 1) // block_size * block_size)


class SharedKvStore:
    """Prompt folders under one directory, shared by every engine configured with it."""

    def __init__(self, path: str, block_size: int) -> None:
        self.path = path
        self.block_size = block_size

    def folder(self, ids: Sequence[int]) -> str:
        digest = hashlib.md5(array("q", ids).tobytes(), usedforsecurity=False).hexdigest()
        return os.path.join(self.path, digest)

    def loadable(self, ids: Sequence[int], cached: int) -> int:
        """Prompt tokens this engine loads from the store beyond the `cached` ones (0: not stored)."""
        tokens = aligned(len(ids) - 1, self.block_size)
        if tokens <= cached or not os.path.isdir(self.folder(ids[:tokens])):
            return 0
        return tokens - cached

    def save(self, ids: Sequence[int]) -> None:
        """Save a computed prompt's KV (its whole blocks but the last token's), unless it is stored."""
        if os.path.isdir(self.folder(ids[: aligned(len(ids) - 1, self.block_size)])):
            return  # vLLM stores only a prompt it did not find
        tokens = aligned(len(ids), self.block_size)
        if tokens:
            os.makedirs(self.folder(ids[:tokens]), exist_ok=True)
