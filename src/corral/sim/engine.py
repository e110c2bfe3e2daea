"""The simulated engine: turns a checked request into a timed token stream through scheduler and prefix cache.

`prepare` applies vLLM's length rules (max_tokens vs max_model_len, the character pre-check, the token
check, clamping max_tokens to the context left) and decides the output. `stream` / `complete` then wait for
admission, "prefill" the uncached part of the prompt, and pace the tokens, keeping the metrics up to date.
After `abort_all` (shutdown) every request stops where it is and never answers, as vLLM's do.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import NoReturn

from corral.sim.config import SimConfig
from corral.sim.faults import FaultInjector
from corral.sim.generator import GenerationPlan, Generator
from corral.sim.logs import EngineLog
from corral.sim.metrics import EngineStats
from corral.sim.prefix_cache import PrefixCache, block_hashes
from corral.sim.protocol import InferenceRequest, bad_request
from corral.sim.scheduler import EngineRequest, LatencyModel, Scheduler
from corral.sim.tokenizer import ToyTokenizer


@dataclass(eq=False)
class Job:
    """A request accepted by the engine: its prompt tokens and its decided output."""

    req: EngineRequest
    prompt_ids: list[int]
    plan: GenerationPlan
    hang: bool = False
    hashes: list[int] = field(default_factory=list)


class Engine:
    def __init__(self, config: SimConfig, tokenizer: ToyTokenizer, log: EngineLog) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.log = log
        self.cache = PrefixCache(config.block_size, config.kv_cache_blocks)
        self.scheduler = Scheduler(config.max_num_seqs, config.kv_cache_blocks, config.block_size)
        self.latency = LatencyModel(
            config.ttft_base_ms, config.prefill_ms_per_token, config.itl_ms, config.max_num_seqs
        )
        self.generator = Generator(config.seed, config.default_max_tokens)
        self.faults = FaultInjector(config.fail_rate, config.crash_after, config.hang_after, config.seed)
        self.stats = EngineStats()
        self.inflight = 0
        self.aborted = False

    # -- admission -------------------------------------------------------------------------------------

    def prepare(self, r: InferenceRequest, request_id: str, now: float) -> Job:
        """Check lengths as vLLM does and decide the output; raises `RequestError`."""
        limit = self.config.max_model_len
        if r.max_tokens is not None:
            if r.max_tokens > limit:
                raise bad_request(
                    f"max_tokens={r.max_tokens} cannot be greater than max_model_len={limit}. "
                    "Please request fewer output tokens.",
                    "max_tokens",
                    r.max_tokens,
                )
            if r.max_tokens < 1:
                raise bad_request(
                    f"max_tokens must be at least 1, got {r.max_tokens}.", "max_tokens", r.max_tokens
                )
        if r.prompt_ids is not None:
            ids = r.prompt_ids
            too_many = len(ids)
        else:
            text = r.prompt_text or ""
            cap = self.config.max_prompt_chars
            if len(text) > cap:
                raise bad_request(
                    f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                    f"{len(text)} characters (more than {cap} characters, which is the upper bound for "
                    f"{limit} input tokens). Please reduce the length of the input prompt.",
                    "input_text",
                    len(text),
                )
            ids = self.tokenizer.encode(text)
            too_many = limit + 1
        if len(ids) > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains at "
                f"least {too_many} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.",
                "input_tokens",
                too_many,
            )
        plan = self.generator.plan(ids, r.max_tokens, limit - len(ids), r.temperature, r.seed, r.stop)
        req = EngineRequest(request_id, len(ids), plan.num_tokens, now)
        return Job(req, ids, plan)

    async def _admit(self, job: Job) -> float:
        """Wait for a slot, look the prompt up in the prefix cache; return the prefill time."""
        await self.scheduler.admit(job.req)
        loop = asyncio.get_running_loop()
        if self.aborted or job.hang:
            await self._hang()
        self.stats.queue_time.observe(loop.time() - job.req.arrival)
        job.hashes = block_hashes(job.prompt_ids, self.config.block_size)
        cached = self.cache.lookup(job.hashes, len(job.prompt_ids))
        self.stats.prompt_tokens += len(job.prompt_ids)
        return self.latency.prefill_seconds(len(job.prompt_ids) - cached)

    def _prefilled(self, job: Job) -> None:
        self.cache.insert(job.hashes)

    async def _hang(self) -> NoReturn:
        """Never answer; only the client closing the connection (task cancellation) ends this."""
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    def _finish(self, job: Job, reason: str, tokens: int, now: float) -> None:
        self.stats.generation_tokens += tokens
        self.stats.success[reason] += 1
        self.stats.e2e.observe(now - job.req.arrival)

    # -- generation ------------------------------------------------------------------------------------

    async def stream(self, job: Job) -> AsyncGenerator[str, None]:
        """Yield the text of each output token at its time."""
        loop = asyncio.get_running_loop()
        emitted = 0
        finished = False
        try:
            prefill = await self._admit(job)
            await asyncio.sleep(prefill)
            self._prefilled(job)
            last = loop.time()
            self.stats.ttft.observe(last - job.req.arrival)
            for i, delta in enumerate(job.plan.deltas):
                if i:
                    await asyncio.sleep(self.latency.itl_seconds(self.scheduler.num_running))
                    now = loop.time()
                    self.stats.itl.observe(now - last)
                    last = now
                if self.aborted:
                    await self._hang()
                emitted += 1
                yield delta
            finished = True
            self._finish(job, job.plan.finish_reason, emitted, loop.time())
        finally:
            if not finished and job.req.admitted_at is not None:
                self._finish(job, "abort", emitted, loop.time())
            self.scheduler.release(job.req)

    async def complete(self, job: Job) -> None:
        """Wait as long as generating the whole output takes."""
        loop = asyncio.get_running_loop()
        finished = False
        try:
            prefill = await self._admit(job)
            n = job.plan.num_tokens
            itl = self.latency.itl_seconds(self.scheduler.num_running)
            await asyncio.sleep(prefill)
            self._prefilled(job)
            self.stats.ttft.observe(loop.time() - job.req.arrival)
            if n > 1:
                await asyncio.sleep(itl * (n - 1))
                self.stats.itl.observe(itl, n - 1)
            if self.aborted:
                await self._hang()
            finished = True
            self._finish(job, job.plan.finish_reason, n, loop.time())
        finally:
            if not finished and job.req.admitted_at is not None:
                self._finish(job, "abort", 0, loop.time())
            self.scheduler.release(job.req)

    # -- failure ---------------------------------------------------------------------------------------

    def abort_all(self) -> None:
        """Stop every request where it is (shutdown with nothing left to drain): none of them will answer."""
        self.aborted = True

    def crash(self) -> NoReturn:
        """Die like an engine core crash: error lines, then exit 1 with requests still in flight."""
        n = self.faults.seen - 1
        self.log.error("EngineCore", "core.py:1036", "EngineCore encountered a fatal error.")
        self.log.error(
            "EngineCore",
            "core.py:1036",
            f"RuntimeError: simulated engine crash (--crash-after "
            f"{self.config.crash_after}) after {n} requests, {self.inflight} in flight",
        )
        self.log.error("APIServer", "async_llm.py:566", "AsyncLLM output_handler failed.")
        self.log.error(
            "APIServer",
            "async_llm.py:566",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
            "encountered an issue. See stack trace (above) for the root cause.",
        )
        sys.stdout.flush()
        os._exit(1)

    def throughput_line(self, prompt_tps: float, gen_tps: float) -> str:
        q, h = self.cache.queries, self.cache.hits
        return (
            f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, Avg generation throughput: "
            f"{gen_tps:.1f} tokens/s, Running: {self.scheduler.num_running} reqs, Waiting: "
            f"{self.scheduler.num_waiting} reqs, GPU KV cache usage: {self.scheduler.kv_usage * 100:.1f}%, "
            f"Prefix cache hit rate: {(h / q * 100) if q else 0.0:.1f}%"
        )
