"""Admission and timing: `--max-num-seqs` running slots, KV blocks reserved per request, a FIFO waiting queue.

A request runs once a slot is free and its blocks fit; otherwise it waits in arrival order (first come,
first served, like vLLM's default policy). While `paused` (sleep, pause) nothing new starts: arrivals queue.
`LatencyModel` turns prefill work and batch size into time-to-first-token and inter-token latency, so
latency grows with load; the scheduler also knows the prefill work in progress, which stretches the decode
steps batched beside it (chunked prefill, as vLLM's v1 scheduler runs it).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class EngineRequest:
    """One generation request as the scheduler sees it."""

    request_id: str
    prompt_len: int
    max_tokens: int
    arrival: float
    blocks: int = 0
    admitted_at: float | None = field(default=None)
    # Set by the engine's control (abort, freeze) or shutdown ("hang"); checked once per token.
    interrupt: str | None = field(default=None)
    # The handler task while a non-streamed request sleeps through its generation (so it can be interrupted).
    task: asyncio.Task[Any] | None = field(default=None)
    # Resolved when a frozen request may go on.
    resumed: asyncio.Future[None] | None = field(default=None)
    recompute: bool = False  # its KV was dropped while frozen: prefill again on resume


class Scheduler:
    def __init__(self, max_num_seqs: int, total_blocks: int, block_size: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.running: set[EngineRequest] = set()
        self._waiting: deque[tuple[EngineRequest, asyncio.Future[None]]] = deque()
        self.reserved_blocks = 0
        self.paused = False
        self._idle: list[asyncio.Future[None]] = []
        # Requests computing their prompt here: when that prefill started and ends, and its tokens.
        self._prefilling: dict[EngineRequest, tuple[float, float, int]] = {}

    @property
    def num_prefilling(self) -> int:
        return len(self._prefilling)

    def prefill_started(self, req: EngineRequest, tokens: int, seconds: float, now: float) -> None:
        """`req` computes `tokens` prompt tokens over the next `seconds` (none: nothing to track)."""
        if tokens > 0:
            self._prefilling[req] = (now, now + seconds, tokens)

    def prefill_done(self, req: EngineRequest) -> None:
        self._prefilling.pop(req, None)

    def prefill_tokens_pending(self, now: float) -> int:
        """Prompt tokens still to compute here: each prefill's tokens times its share of time left."""
        pending = 0.0
        for start, end, tokens in self._prefilling.values():
            if end > now:
                pending += tokens * min(1.0, (end - now) / (end - start))
        return math.ceil(pending)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self.reserved_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.reserved_blocks

    def blocks_for(self, req: EngineRequest) -> int:
        return min(self.total_blocks, math.ceil((req.prompt_len + req.max_tokens) / self.block_size))

    def _fits(self, req: EngineRequest) -> bool:
        return len(self.running) < self.max_num_seqs and self.blocks_for(req) <= self.free_blocks

    def _start(self, req: EngineRequest, now: float) -> None:
        req.blocks = self.blocks_for(req)
        req.admitted_at = now
        self.reserved_blocks += req.blocks
        self.running.add(req)

    async def admit(self, req: EngineRequest) -> bool:
        """Return True once `req` is running, False if it was aborted while waiting (FIFO while full)."""
        loop = asyncio.get_running_loop()
        if not self._waiting and not self.paused and self._fits(req):
            self._start(req, loop.time())
            return True
        fut: asyncio.Future[None] = loop.create_future()
        entry = (req, fut)
        self._waiting.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(req)
            else:
                try:
                    self._waiting.remove(entry)
                except ValueError:
                    pass
                self._schedule_waiting(loop.time())
            raise
        return req.admitted_at is not None

    def release(self, req: EngineRequest) -> None:
        """Free the slot and blocks of a finished, aborted or cancelled request; start waiting ones."""
        self._prefilling.pop(req, None)
        if req in self.running:
            self.running.remove(req)
            self.reserved_blocks -= req.blocks
            self._schedule_waiting(asyncio.get_running_loop().time())
            if not self.running and self._idle:
                for fut in self._idle:
                    if not fut.done():
                        fut.set_result(None)
                self._idle.clear()

    def pin(self, blocks: int) -> None:
        """Keep `blocks` allocated past their request (a prefill's blocks held for a remote decode)."""
        self.reserved_blocks += blocks

    def unpin(self, blocks: int) -> None:
        """Free blocks `pin` kept; waiting requests may start."""
        self.reserved_blocks -= blocks
        self._schedule_waiting(asyncio.get_running_loop().time())

    async def wait_idle(self) -> None:
        """Return once nothing runs (a pause in mode wait drains this way)."""
        if self.running:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(fut)
            await fut

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._schedule_waiting(asyncio.get_running_loop().time())

    def abort_waiting(self, request_ids: set[str] | None = None) -> list[EngineRequest]:
        """Take waiting requests (all, or those named) out of the queue; their `admit` returns False."""
        kept: deque[tuple[EngineRequest, asyncio.Future[None]]] = deque()
        aborted: list[EngineRequest] = []
        for req, fut in self._waiting:
            if request_ids is None or req.request_id in request_ids:
                req.interrupt = "abort"
                aborted.append(req)
                if not fut.done():
                    fut.set_result(None)
            else:
                kept.append((req, fut))
        self._waiting = kept
        return aborted

    def _schedule_waiting(self, now: float) -> None:
        if self.paused:
            return
        while self._waiting and self._fits(self._waiting[0][0]):
            req, fut = self._waiting.popleft()
            if fut.done():
                continue
            self._start(req, now)
            fut.set_result(None)


@dataclass(frozen=True)
class LatencyModel:
    """How long prefill and each decode step take, in seconds."""

    ttft_base_ms: float
    prefill_ms_per_token: float
    itl_ms: float
    max_num_seqs: int
    max_num_batched_tokens: int = 2048  # vLLM's token budget per engine step (`vllm serve`'s default)

    def prefill_seconds(self, uncached_tokens: int) -> float:
        return (self.ttft_base_ms + uncached_tokens * self.prefill_ms_per_token) / 1000.0

    def itl_seconds(self, running: int) -> float:
        # A full batch decodes about 1.5x slower per token than a lone request.
        load = max(0, running - 1) / max(1, self.max_num_seqs)
        return self.itl_ms * (1.0 + 0.5 * load) / 1000.0

    def prefill_chunk(self, pending: int, decodes: int) -> int:
        """Prompt tokens one engine step carries beside `decodes` decode tokens (chunked prefill)."""
        return max(0, min(self.max_num_batched_tokens - decodes, pending))

    def stretch_seconds(self, pending: int, decodes: int) -> float:
        """How much longer a decode step takes for the prefill chunk batched with it."""
        return self.prefill_chunk(pending, decodes) * self.prefill_ms_per_token / 1000.0

    def stretched_steps(self, pending: int, decodes: int, steps: int) -> tuple[int, float]:
        """Of `steps` decode steps starting now, how many carry prefill chunks and their extra seconds in
        all: the chunks eat the pending prefill at the budget left beside the decodes."""
        room = self.max_num_batched_tokens - decodes
        if pending <= 0 or steps <= 0 or room <= 0:
            return 0, 0.0
        tokens = min(pending, steps * room)
        return min(steps, math.ceil(pending / room)), tokens * self.prefill_ms_per_token / 1000.0
