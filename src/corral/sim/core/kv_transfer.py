"""The simulated KV connector of a disaggregated engine (`--kv-transfer-config`): a prefill engine holds a
finished prefill's blocks for its decode engine until they are pulled or their lease runs out; a decode
engine pulls them (through an injected `fetch`, the HTTP side channel) instead of computing the prefill.

As vLLM's NIXL connector: the held blocks stay allocated (they count in KV usage), a lease
(`kv_lease_duration`) frees blocks nobody pulled and counts them expired, a pull of blocks that are gone
fails, and a failed load finishes the request with an error (kv_load_failure_policy "fail") or computes
the prefill locally ("recompute"). A storage connector (ExampleConnector, ...: `pd.STORAGE_CONNECTORS`)
holds nothing and answers no params: its engines share prompts' KV through a `SharedKvStore` instead.
See docs/pd-conformance.md for where the simulation differs.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from corral.engine import pd_protocol as pd
from corral.sim.core.kv_store import DEFAULT_PATH, SharedKvStore
from corral.sim.core.scheduler import Scheduler
from corral.sim.core.stats import Histogram

# vLLM's NIXL histogram buckets (kv_connector/v1/nixl/stats.py).
XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
# How many expired request ids a prefill engine remembers, to tell a late pull from an unknown one.
EXPIRED_REMEMBERED = 4096


class KvLoadFailed(Exception):
    """A decode request's blocks could not be pulled and the policy is "fail": the request ends in error."""


@dataclass(frozen=True)
class PullAnswer:
    """A prefill engine's answer to a pull: `ok`, else why not (unknown, expired, failed)."""

    outcome: str
    blocks: int = 0
    nbytes: int = 0


# (host, port, remote request id, blocks wanted, timeout seconds) -> the answer
Fetch = Callable[[str, int, str, int, int], Awaitable[PullAnswer]]


@dataclass(eq=False)
class HeldTransfer:
    """A finished prefill's blocks, held for the decode engine that will pull them."""

    request_id: str
    blocks: int
    tokens: int
    reading: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    expiry: asyncio.TimerHandle | None = None


@dataclass
class TransferStats:
    """The connector's counters and histograms (vLLM's `vllm:nixl_*`), read at scrape time."""

    xfer_time: Histogram = field(default_factory=lambda: Histogram(XFER_TIME_BUCKETS))
    bytes_transferred: Histogram = field(default_factory=lambda: Histogram(BYTES_BUCKETS))
    descriptors: Histogram = field(default_factory=lambda: Histogram(DESCRIPTOR_BUCKETS))
    failed_transfers: int = 0
    expired: int = 0
    notifications_after_expiry: int = 0


class KvTransfers:
    """One engine's side of every transfer: blocks it holds (prefill) and pulls it runs (decode)."""

    def __init__(
        self,
        config: dict[str, Any],
        engine_id: str,
        scheduler: Scheduler,
        bytes_per_block: int,
        ms_per_block: float,
        fail_rate: float = 0.0,
        hang: bool = False,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.role = pd.role_of(config)
        self.connector = str(config.get("kv_connector"))
        self.handoff = pd.handoff_of(self.connector) or pd.PARAMS  # an unknown connector: as NIXL
        self.store: SharedKvStore | None = None
        if self.handoff == pd.STORAGE:
            extra = config.get("kv_connector_extra_config") or {}
            path = str(extra.get("shared_storage_path") or DEFAULT_PATH)
            self.store = SharedKvStore(path, scheduler.block_size)
        self.lease_s = pd.lease_seconds(config)
        self.recompute = config.get("kv_load_failure_policy", pd.DEFAULT_FAILURE_POLICY) == "recompute"
        self.engine_id = engine_id
        self.scheduler = scheduler
        self.bytes_per_block = bytes_per_block
        self.ms_per_block = ms_per_block
        self.fail_rate = fail_rate
        self.hang = hang
        self._rng = random.Random(seed * 7919 + 23)
        self.held: dict[str, HeldTransfer] = {}
        self.pulls_in_flight = 0
        self.stats = TransferStats()
        self.side_channel: tuple[str, int] = ("127.0.0.1", 0)  # set once the server is bound
        self.fetch: Fetch | None = None  # set by the HTTP layer
        self._next_block = itertools.count()
        self._next_hold = itertools.count()
        self._expired_ids: dict[str, None] = {}  # the latest EXPIRED_REMEMBERED, oldest first

    @property
    def produces(self) -> bool:
        """Whether a finished prefill asked for remote decode is held for a pull (never with a store)."""
        return self.role in ("prefill", "both") and self.store is None

    @property
    def consumes(self) -> bool:
        return self.role in ("decode", "both")

    # -- prefill side ----------------------------------------------------------------------------------

    def hold(self, request_id: str, prompt_len: int, tp_size: int) -> dict[str, Any]:
        """Keep a finished prefill's prompt blocks for a remote decode; the params its answer returns."""
        request_id = f"{request_id}-{next(self._next_hold):x}"  # a client's x-request-id may repeat
        blocks = math.ceil(prompt_len / self.scheduler.block_size)
        ids = [next(self._next_block) % max(1, self.scheduler.total_blocks) for _ in range(blocks)]
        held = HeldTransfer(request_id, blocks, prompt_len)
        self.scheduler.pin(blocks)
        held.expiry = asyncio.get_running_loop().call_later(self.lease_s, self._expire, held)
        self.held[request_id] = held
        host, port = self.side_channel
        return {
            pd.DO_REMOTE_PREFILL: True,
            pd.DO_REMOTE_DECODE: False,
            pd.REMOTE_BLOCK_IDS: [ids],
            pd.REMOTE_ENGINE_ID: self.engine_id,
            pd.REMOTE_REQUEST_ID: request_id,
            pd.REMOTE_HOST: host,
            pd.REMOTE_PORT: port,
            pd.TP_SIZE: tp_size,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": prompt_len,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
        }

    def _free(self, held: HeldTransfer) -> None:
        if self.held.pop(held.request_id, None) is None:
            return
        if held.expiry is not None:
            held.expiry.cancel()
        self.scheduler.unpin(held.blocks)
        held.gone.set()

    def _expire(self, held: HeldTransfer) -> None:
        if held.request_id in self.held:
            self.stats.expired += 1
            self._expired_ids[held.request_id] = None
            if len(self._expired_ids) > EXPIRED_REMEMBERED:
                del self._expired_ids[next(iter(self._expired_ids))]
            self._free(held)

    async def serve_pull(self, request_id: str, wanted: int | None = None) -> PullAnswer:
        """A decode engine reads `wanted` (default: all) of the blocks of `request_id` (those its own prefix
        cache lacks): after their transfer time all of them are freed."""
        held = self.held.get(request_id)
        if held is None or held.reading:
            if request_id in self._expired_ids:
                self.stats.notifications_after_expiry += 1
                return PullAnswer("expired")
            return PullAnswer("unknown")
        if self.fail_rate > 0 and self._rng.random() < self.fail_rate:
            return PullAnswer("failed")  # the blocks stay held until the lease runs out, as stranded
        held.reading = True
        blocks = held.blocks if wanted is None else max(0, min(wanted, held.blocks))
        if self.hang:
            await held.gone.wait()  # never completes: the lease frees the blocks
            return PullAnswer("expired")
        try:
            await asyncio.wait_for(held.gone.wait(), blocks * self.ms_per_block / 1000.0)
        except TimeoutError:
            self._free(held)
            return PullAnswer("ok", blocks, blocks * self.bytes_per_block)
        return PullAnswer("expired")

    # -- decode side -----------------------------------------------------------------------------------

    async def pull(self, params: dict[str, Any], tokens: int) -> bool:
        """Pull the KV of `tokens` prompt tokens (those not in the local prefix cache) from the prefill
        engine `params` name; False when the load failed and the policy is "recompute" (raises KvLoadFailed
        under "fail")."""
        host, port = params.get(pd.REMOTE_HOST), params.get(pd.REMOTE_PORT)
        request_id = params.get(pd.REMOTE_REQUEST_ID)
        answer = PullAnswer("unknown")
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.pulls_in_flight += 1
        try:
            if self.fetch is not None and isinstance(host, str) and isinstance(port, int) and request_id:
                wanted = math.ceil(tokens / self.scheduler.block_size)
                answer = await self.fetch(host, port, str(request_id), wanted, self.lease_timeout_s)
        finally:
            self.pulls_in_flight -= 1
        if answer.outcome == "ok":
            self.stats.xfer_time.observe(loop.time() - start)
            self.stats.bytes_transferred.observe(float(answer.nbytes))
            self.stats.descriptors.observe(float(answer.blocks))
            return True
        self.stats.failed_transfers += 1
        if self.recompute:
            return False
        raise KvLoadFailed(f"KV load of {request_id} from {host}:{port} failed: {answer.outcome}")

    def load_seconds(self, tokens: int) -> float:
        """How long loading `tokens` prompt tokens from the shared store takes: per block, as a pull."""
        return math.ceil(tokens / self.scheduler.block_size) * self.ms_per_block / 1000.0

    @property
    def lease_timeout_s(self) -> int:
        """How long a pull may take before the decode engine gives up: past any lease of the producer."""
        return int(self.lease_s * 2 + 30)

    def abort_all(self) -> None:
        """Shutdown: every held block is freed (the process is going away)."""
        for held in list(self.held.values()):
            self._free(held)
