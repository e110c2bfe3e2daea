"""The simulated ExampleConnector store: vLLM's folder key (md5 of the token ids as int64), what a prompt
saves (whole blocks of n - 1 tokens) and what a later prompt loads (whole blocks of n - 2, less what the
local prefix cache holds), checked on a real temporary directory."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from corral.sim.core.kv_store import SharedKvStore


def test_the_folder_is_named_as_vllm_names_it(tmp_path: Path) -> None:
    store = SharedKvStore(str(tmp_path), 16)
    expected = hashlib.md5(struct.pack("<3q", 1, 2, 300)).hexdigest()
    assert store.folder([1, 2, 300]) == str(tmp_path / expected)


def test_a_saved_prompt_loads_its_whole_blocks_on_any_engine_of_the_directory(tmp_path: Path) -> None:
    prompt = list(range(100))
    producer, consumer = SharedKvStore(str(tmp_path), 16), SharedKvStore(str(tmp_path), 16)
    assert consumer.loadable(prompt, 0) == 0
    producer.save(prompt)
    assert [p.name for p in tmp_path.iterdir()] == [Path(producer.folder(prompt[:96])).name]
    assert consumer.loadable(prompt, 0) == 96
    assert consumer.loadable(prompt, 32) == 64  # the local prefix cache's blocks are not loaded
    assert consumer.loadable(prompt, 96) == 0
    assert consumer.loadable(list(range(1, 101)), 0) == 0  # other tokens, other folder
    producer.save(prompt)  # found: not saved again
    assert len(list(tmp_path.iterdir())) == 1


def test_a_prompt_of_whole_blocks_plus_one_is_saved_under_a_key_it_is_not_looked_up_by(
    tmp_path: Path,
) -> None:
    """vLLM saves n - 1 tokens aligned down and looks up n - 2 aligned down: for n = 97 (96 + 1) those
    are 96 and 80 tokens, so the prompt misses its own folder (ExampleConnector assumes the stored prompt
    is the looked-up one less a generated token)."""
    store = SharedKvStore(str(tmp_path), 16)
    prompt = list(range(97))
    store.save(prompt)
    assert Path(store.folder(prompt[:96])).is_dir()
    assert store.loadable(prompt, 0) == 0


def test_a_prompt_shorter_than_a_block_and_one_saves_nothing(tmp_path: Path) -> None:
    store = SharedKvStore(str(tmp_path), 16)
    store.save(list(range(16)))
    assert list(tmp_path.iterdir()) == []
