"""The simulated engine: turns a checked request into a timed token stream through scheduler and prefix cache.

`prepare` applies vLLM's length rules (max_tokens vs max_model_len, the character pre-check, the token
check, clamping max_tokens to the context left) and decides the output. `stream` / `complete` then wait for
admission, "prefill" the uncached part of the prompt, and pace the tokens, keeping the metrics up to date;
while prompts are being computed here, each decode step is stretched by the prefill chunk batched with it.
After `abort_all` (shutdown) every request stops where it is and never answers, as vLLM's do.

`EngineControl` (sleep, pause, abort) reaches a running request through its `EngineRequest.interrupt`:
a stream looks at it once per token, a non-streamed request is woken from its single long sleep. A frozen
request waits for `resumed`, prefilling again if its KV cache was dropped meanwhile; an aborted one ends
early with `finish_reason: "abort"`. Nothing of this costs more than one attribute read per token.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from corral.engine import pd_protocol as pd
from corral.engine.sim_tokenizer import ToyTokenizer
from corral.sim.core import gpu_fault_lines
from corral.sim.core.cache_events import CachedLora, CacheEvents
from corral.sim.core.config import SimConfig
from corral.sim.core.faults import FaultInjector
from corral.sim.core.generator import GenerationPlan, Generator, garbage
from corral.sim.core.kv_transfer import KvLoadFailed, KvTransfers
from corral.sim.core.logs import EngineLog
from corral.sim.core.lora import LoraAdapter, LoraRegistry
from corral.sim.core.prefix_cache import PrefixCache
from corral.sim.core.requests import InferenceRequest, bad_request
from corral.sim.core.scheduler import EngineRequest, LatencyModel, Scheduler
from corral.sim.core.stats import EngineStats


@dataclass(eq=False)
class Job:
    """A request accepted by the engine: its prompt tokens and its decided output."""

    req: EngineRequest
    prompt_ids: list[int]
    plan: GenerationPlan
    hang: bool = False
    hashes: list[int] = field(default_factory=list)
    adapter: str | None = None
    lora: CachedLora | None = None  # the adapter's identity in block hashes (with KV events)
    aborted: bool = False  # ended early with finish_reason "abort"
    emitted: int = 0  # tokens produced (set when it ends)
    lora_running: bool = False
    transfer: dict[str, Any] | None = None  # the request's kv_transfer_params (with a connector only)
    remote_params: dict[str, Any] | None = None  # what a prefill's answer returns for its decode engine
    failed: bool = False  # its KV load failed: finished with an error
    cached: int = 0  # prompt tokens its engine's prefix cache served

    def created_cache_tokens(self, block_size: int) -> int:
        """Tokens of the prompt's full blocks this request added to the prefix cache (vLLM's
        `created_cache_tokens`: the full blocks cached once it was prefilled, less those it found)."""
        return max(0, len(self.hashes) * block_size - self.cached)

    @property
    def finish_reason(self) -> str:
        return "abort" if self.aborted else self.plan.finish_reason

    @property
    def stop_reason(self) -> str | None:
        return None if self.aborted else self.plan.stop_reason

    @property
    def text(self) -> str:
        return "".join(self.plan.deltas[: self.emitted]) if self.aborted else self.plan.text


class Engine:
    def __init__(self, config: SimConfig, tokenizer: ToyTokenizer, log: EngineLog) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.log = log
        events = None
        if config.kv_events is not None:
            events = CacheEvents(config.block_size, config.prefix_caching_hash_algo, config.hash_seed)
        self.cache = PrefixCache(config.block_size, config.kv_cache_blocks, events)
        self.scheduler = Scheduler(config.max_num_seqs, config.kv_cache_blocks, config.block_size)
        self.latency = LatencyModel(
            config.ttft_base_ms,
            config.prefill_ms_per_token,
            config.itl_ms,
            config.max_num_seqs,
            config.max_num_batched_tokens,
        )
        self.generator = Generator(config.seed, config.default_max_tokens)
        self.faults = FaultInjector(
            config.fail_rate,
            config.crash_after,
            config.hang_after,
            config.seed,
            config.fail_rate_after,
            gpu_fault_after=config.gpu_fault_after if config.gpu_fault is not None else None,
            wrong_answer_after=config.wrong_answer_after if config.wrong_answer is not None else None,
        )
        self.stats = EngineStats()
        self.inflight = 0
        self.aborted = False
        self.dead = False  # a worker died: /health 503, every request 500 (EngineDeadError)
        self.garbage = False  # serving from memory that holds no model (set by EngineControl)
        self.rejecting = False  # POST /pause: new requests get a retryable 503 (set by EngineControl)
        self.lora: LoraRegistry | None = None
        self.kv: KvTransfers | None = None  # the KV connector, with --kv-transfer-config

    # -- admission -------------------------------------------------------------------------------------

    def prepare(
        self, r: InferenceRequest, request_id: str, now: float, adapter: LoraAdapter | None = None
    ) -> Job:
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
        generator = self.generator if adapter is None else adapter.generator
        plan = generator.plan(ids, r.max_tokens, limit - len(ids), r.temperature, r.seed, r.stop)
        req = EngineRequest(request_id, len(ids), plan.num_tokens, now)
        job = Job(req, ids, plan)
        if self.kv is not None:
            job.transfer = r.kv_transfer_params
        if adapter is not None:
            job.adapter = adapter.name
            job.lora = CachedLora(adapter.name, adapter.path, adapter.int_id)
        return job

    async def _admit(self, job: Job) -> float | None:
        """Wait for a slot, look the prompt up in the prefix cache; the prefill time, None if aborted."""
        if job.adapter is not None and self.lora is not None:
            self.lora.request_waiting(job.adapter)
            admitted = await self.scheduler.admit(job.req)
            if admitted:
                self.lora.request_running(job.adapter)
                job.lora_running = True
        else:
            admitted = await self.scheduler.admit(job.req)
        if not admitted:
            return None
        loop = asyncio.get_running_loop()
        if self.aborted or job.hang:
            await self._hang()
        if self.garbage:
            job.plan = garbage(job.plan)
        self.stats.queue_time.observe(loop.time() - job.req.arrival)
        job.hashes = self.cache.hashes(job.prompt_ids, job.lora)
        n = len(job.prompt_ids)
        cached = job.cached = self.cache.lookup(job.hashes, n)
        self.stats.prompt_tokens += n
        self.stats.prompt_by_source["local_cache_hit"] += cached
        if await self._pulled(job, n - cached):
            # the prompt's KV came from the prefill engine: one forward step yields the first token
            self.stats.prompt_by_source["external_kv_transfer"] += n - cached
            return self.latency.prefill_seconds(0)
        kv, loaded, load_s = self.kv, 0, 0.0
        if kv is not None and kv.store is not None:  # a storage connector: what the store holds loads
            loaded = kv.store.loadable(job.prompt_ids, cached)
            load_s = kv.load_seconds(loaded)
            self.stats.prompt_by_source["external_kv_transfer"] += loaded
        computed = n - cached - loaded
        self.stats.prompt_by_source["local_compute"] += computed
        seconds = self.latency.prefill_seconds(computed) + load_s
        self.scheduler.prefill_started(job.req, computed, seconds, loop.time())
        return seconds

    async def _pulled(self, job: Job, tokens: int) -> bool:
        """Pull a remote prefill's blocks when the request carries them; False: compute the prefill here."""
        kv, params = self.kv, job.transfer
        if kv is None or kv.store is not None or not kv.consumes:
            return False  # no connector, or a storage one: the store is where its KV loads from
        if not params or not params.get(pd.DO_REMOTE_PREFILL):
            return False
        try:
            return await kv.pull(params, tokens)
        except KvLoadFailed as exc:
            self.log.error("EngineCore", "scheduler.py:2195", f"{exc}; finishing the request with an error")
            job.failed = True
            self._finish(job, "error", 0, asyncio.get_running_loop().time())
            raise

    def _prefilled(self, job: Job) -> None:
        self.scheduler.prefill_done(job.req)
        self.cache.insert(job.hashes, token_ids=job.prompt_ids, lora=job.lora)
        if self.kv is not None and self.kv.store is not None:
            self.kv.store.save(job.prompt_ids)

    def _decodes(self) -> int:
        return self.scheduler.num_running - self.scheduler.num_prefilling

    def _decode_step(self, now: float) -> float:
        """One decode step, stretched by the prefill chunk batched with it while prompts are computed."""
        itl = self.latency.itl_seconds(self.scheduler.num_running)
        if not self.scheduler.num_prefilling:
            return itl
        pending = self.scheduler.prefill_tokens_pending(now)
        return itl + self.latency.stretch_seconds(pending, self._decodes())

    async def _hang(self) -> NoReturn:
        """Never answer; only the client closing the connection (task cancellation) ends this."""
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    def _finish(self, job: Job, reason: str, tokens: int, now: float) -> None:
        self.stats.generation_tokens += tokens
        self.stats.success[reason] += 1
        self.stats.e2e.observe(now - job.req.arrival)

    # -- generation ------------------------------------------------------------------------------------

    def _end(self, job: Job, aborted: bool, emitted: int, now: float) -> None:
        job.aborted, job.emitted = aborted, emitted
        kv, params = self.kv, job.transfer
        if not aborted and kv is not None and kv.produces and params and params.get(pd.DO_REMOTE_DECODE):
            job.remote_params = kv.hold(
                job.req.request_id, len(job.prompt_ids), self.config.tensor_parallel_size
            )
        self._finish(job, "abort" if aborted else job.plan.finish_reason, emitted, now)

    def _release(self, job: Job) -> None:
        self.scheduler.release(job.req)
        if job.adapter is not None and self.lora is not None:
            self.lora.request_done(job.adapter, job.lora_running)

    async def _interrupted(self, job: Job, emitted: int) -> bool:
        """Handle what control asked of this request: False to abort it, True to go on (after a freeze)."""
        req = job.req
        loop = asyncio.get_running_loop()
        while True:
            kind = req.interrupt
            if kind is None:
                return True
            if kind == "hang":
                await self._hang()
            if kind == "abort":
                return False
            fut: asyncio.Future[None] = loop.create_future()
            req.resumed = fut
            try:
                await fut
            finally:
                req.resumed = None
            if req.recompute and req.interrupt is None:
                # Its KV cache was dropped while it was frozen (sleep level >= 1, release_kv_cache_memory).
                req.recompute = False
                self.stats.preemptions += 1
                await asyncio.sleep(self.latency.prefill_seconds(len(job.prompt_ids) + emitted))

    async def _pace(self, job: Job, seconds: float, itl: float) -> int | None:
        """Sleep `seconds` of generation; frozen time does not count. None when done, else the tokens
        generated (at `itl` each) before an abort."""
        req = job.req
        loop = asyncio.get_running_loop()
        remaining = seconds
        while True:
            if req.interrupt is not None and not await self._interrupted(job, 0):
                return int((seconds - remaining) / itl) if itl > 0 else 0
            start = loop.time()
            task = req.task = asyncio.current_task()
            try:
                await asyncio.sleep(remaining)
                return None
            except asyncio.CancelledError:
                # EngineControl clears `task` before it cancels; anything else is the client going away.
                if req.task is not None or task is None:
                    raise
                task.uncancel()
                remaining = max(0.0, remaining - (loop.time() - start))
            finally:
                req.task = None

    async def stream(self, job: Job) -> AsyncGenerator[str, None]:
        """Yield the text of each output token at its time (fewer, and `job.aborted`, when aborted)."""
        loop = asyncio.get_running_loop()
        req = job.req
        emitted = 0
        finished = False
        try:
            prefill = await self._admit(job)
            if prefill is None:
                finished = True
                self._end(job, True, 0, loop.time())
                return
            await asyncio.sleep(prefill)
            if req.interrupt is not None and not await self._interrupted(job, 0):
                finished = True
                self._end(job, True, 0, loop.time())
                return
            self._prefilled(job)
            last = loop.time()
            self.stats.ttft.observe(last - req.arrival)
            for i, delta in enumerate(job.plan.deltas):
                if i:
                    await asyncio.sleep(self._decode_step(last))
                    now = loop.time()
                    self.stats.itl.observe(now - last)
                    last = now
                if req.interrupt is not None and not await self._interrupted(job, emitted):
                    finished = True
                    self._end(job, True, emitted, loop.time())
                    return
                emitted += 1
                yield delta
            finished = True
            self._end(job, False, emitted, loop.time())
        finally:
            if not finished and not job.failed and req.admitted_at is not None:
                self._finish(job, "abort", emitted, loop.time())
            self._release(job)

    async def complete(self, job: Job) -> None:
        """Wait as long as generating the whole output takes (less, and `job.aborted`, when aborted)."""
        loop = asyncio.get_running_loop()
        req = job.req
        finished = False
        try:
            prefill = await self._admit(job)
            if prefill is None:
                finished = True
                self._end(job, True, 0, loop.time())
                return
            n = job.plan.num_tokens
            itl = self.latency.itl_seconds(self.scheduler.num_running)
            if await self._pace(job, prefill, 0.0) is not None:
                finished = True
                self._end(job, True, 0, loop.time())
                return
            self._prefilled(job)
            self.stats.ttft.observe(loop.time() - req.arrival)
            if n > 1:
                # the prefills in progress now stretch the first steps of this paced generation
                pending = self.scheduler.prefill_tokens_pending(loop.time())
                spiked, extra = self.latency.stretched_steps(pending, self._decodes(), n - 1)
                total = itl * (n - 1) + extra
                done = await self._pace(job, total, total / (n - 1))
                if done is not None:
                    finished = True
                    self._end(job, True, min(n - 1, 1 + done), loop.time())
                    return
                if spiked:
                    self.stats.itl.observe(itl + extra / spiked, spiked)
                self.stats.itl.observe(itl, n - 1 - spiked)
            if self.aborted:
                await self._hang()
            finished = True
            self._end(job, False, n, loop.time())
        finally:
            if not finished and not job.failed and req.admitted_at is not None:
                self._finish(job, "abort", 0, loop.time())
            self._release(job)

    # -- failure ---------------------------------------------------------------------------------------

    def abort_all(self) -> None:
        """Stop every request where it is (shutdown with nothing left to drain): none of them will answer."""
        self.aborted = True
        for req in self.scheduler.running:
            req.interrupt = "hang"
            if req.resumed is not None and not req.resumed.done():
                req.resumed.set_result(None)

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

    def die_of_gpu_fault(self) -> NoReturn:
        """Die as vLLM does of `--gpu-fault`: the fault's lines, the engine-dead lines, then exit 1."""
        kind = self.config.gpu_fault or gpu_fault_lines.ILLEGAL_MEMORY_ACCESS
        if kind == gpu_fault_lines.NCCL_TIMEOUT:
            for line in gpu_fault_lines.watchdog_lines(0):
                self.log.plain(line)
        for line in gpu_fault_lines.core_lines(kind):
            self.log.error("EngineCore", "core.py:1036", line)
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
