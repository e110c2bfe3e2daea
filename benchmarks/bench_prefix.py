"""Shared-prefix routing benchmark: one run, the same simulated fleet, every router.

Workload: `--groups` groups, each with a long system prompt of its own and `--users` users; a request
is one user's question after its group's system prompt, streamed, arriving as a Poisson process at
`--rate` requests/s for `--seconds` (bounded count and time). `--workload issue17` is issue 17's: 12
groups of 600-1200-token system prompts, multi-turn users (a user's turn carries its earlier turns, so
each extends the conversation before it), each engine's prefix cache about a third of the system
prompts, 8 requests/s. Four presets differ from it the ways real traffic does (each sets its own rate, so
that the fleet is loaded but the oracle's p90 stays near its unloaded value):

- `zipf`: 60 groups of 300-700-token system prompts on 4 engines, popularity Zipf (s = 1: the hottest
  group a fifth of the traffic, a long tail), single-turn, 16 requests/s, each engine's cache a quarter
  of the prompts. The oracle pins each group, the groups dealt hottest first to the engine with the
  least expected load so far.
- `rag`: a 150-token system prompt common to every request, then one of 24 documents of 800-1500 tokens
  (Zipf s = 0.8), then a unique question. The oracle pins each document as above.
- `burst`: 16 groups of 400-800-token system prompts, 4 requests/s spread evenly, and every 8 s a flash
  crowd: 3 s of 24 requests/s more for one group (the next each time), nearly all one engine serves (2
  sequences at a time, 32 tokens each).
  The oracle pins every group, the hot one included, so the burst queues on its engine; a router that
  gives a hot prefix a second holder beats it.
- `agentic`: 12 sessions (Zipf s = 0.8 over them) behind one 400-token tool prompt common to all; each turn
  carries the session's whole history and appends 200-600 tokens of its own, so the session's history is
  the prefix to follow and grows to thousands of tokens. The oracle pins each session as above.

Before each target's measured phase every
group sends one request through it (the same warm-up for every target); each target gets fresh system
prompts, so what an earlier target left in the engines' caches is junk that LRU evicts first.

Fleet: 4 `corral sim` engines whose prefix cache holds only a fraction of all system prompts
(`--kv-cache-blocks`), with a prefill cost per uncached token that makes cache hits matter.

Targets: `oracle` (no router: the load generator pins each group to one engine, the groups balanced
over the engines, as a router that knew every cache and every group's traffic would); `corral router`
with round_robin, least_request, prefix, and prefix with the placement before issue 17 (`prefix
(ring)`: ring homes, the strict load bound); two `corral router --policy prefix` replicas behind a
random splitter (the load generator picks one per request); the Rust `vllm-router` with cache_aware
and round_robin. `--kv-events` adds the prefix targets routed by the engines' KV-cache events (the
sims publish them, the routers read them with `--tokenizer sim`).

`corral prefix (deployed)` is the router as a user deploys it: `corral router --backend ... --policy
prefix` and no other routing flag (no --workers: one worker per CPU; no policy config: its defaults).

`--sweep N --sweep-seed S` (prefix_sweep.py): N draws of a randomized family of these workloads, each on
fresh engines, with a few seconds of load each; per draw and target TTFT p90 / the oracle's and hit rate
against the oracle's; then per target the median and the worst over the draws. The targets are the oracle,
the prefix policy deployed, with --workers 1 and 2, two single-process replicas, and round robin (with
`--kv-events`, the prefix targets again routed by events).

`--workload mooncake` (mooncake_trace.py): a subset of Mooncake's FAST'25 synthetic trace
(benchmarks/data/README.md), each 512-token block id mapped to deterministic text and the trace shrunk so
this machine keeps up, against the same targets, vllm-router, and `reference`, a cost-model router in the
load generator that sends each request where its prefill would finish first.

Reported per target: TTFT p50/p90/p99, throughput, prefix-cache hit rate (token hits / token queries
from the engines' /metrics, deltas over the measured phase), and load spread (max / mean of requests per
engine, from vllm:request_success_total deltas).

    .venv/bin/python benchmarks/bench_prefix.py [--rate 40] [--seconds 15] [--markdown]
    .venv/bin/python benchmarks/bench_prefix.py --workload issue17 [--kv-events] [--markdown]
    .venv/bin/python benchmarks/bench_prefix.py --workload zipf|rag|agentic|burst [--kv-events] [--markdown]
    .venv/bin/python benchmarks/bench_prefix.py --sweep 20 --sweep-seed 2812 [--kv-events] [--sweep-draws 3,7]
    .venv/bin/python benchmarks/bench_prefix.py --workload mooncake [--trace FILE] [--kv-events]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import secrets
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mooncake_trace
import prefix_sweep
from bench_router import ROOT, Proc, find_vllm_router, free_port, spawn, wait_ready
from corral.engine.sim_tokenizer import WORDS
from loadgen import Report, Sample, check_loopback, exit_on_sigterm

MODEL = "bench-model"
ENGINES = 4


def system_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


# --workload issue17: issue 17's shared-prefix workload (the arguments it sets; the others keep theirs).
ISSUE17 = {
    "groups": 12,
    "users": 4,
    "system_words": (600, 1200),
    "multi_turn": True,
    "rate": 8.0,
    "seconds": 40.0,
    # By the end of a run the prefixes are 12 system prompts of 900 tokens on average and 48
    # conversations of about 150 tokens: ~18k tokens, 1,125 blocks of 16; a third of them per engine.
    "kv_cache_blocks": 384,
}
# --workload zipf / rag / agentic / burst: shapes issue 17's workload does not have (the module's docstring).
PRESETS: dict[str, dict[str, Any]] = {
    "issue17": ISSUE17,
    "zipf": {
        "groups": 60,
        "users": 4,
        "system_words": (300, 700),
        "zipf": 1.0,
        "rate": 16.0,
        "seconds": 30.0,
        # 60 prompts of 500 tokens: ~1,900 blocks of 16; a quarter of them per engine
        "kv_cache_blocks": 480,
    },
    "rag": {
        "groups": 24,
        "users": 64,
        "shared_words": 150,
        "system_words": (800, 1500),
        "zipf": 0.8,
        "rate": 6.0,
        "seconds": 30.0,
        # 24 documents of 1,150 tokens: ~1,750 blocks; a third of them per engine
        "kv_cache_blocks": 600,
    },
    "agentic": {
        "groups": 12,
        "users": 1,
        "shared_words": 400,
        "system_words": (0, 0),
        "multi_turn": True,
        "turn_words": (200, 600),
        "zipf": 0.8,
        "rate": 3.0,
        "seconds": 30.0,
        "max_model_len": 16384,
        # 12 sessions of up to ~4,000 tokens by the end: ~3,000 blocks; a third of them per engine
        "kv_cache_blocks": 1000,
    },
    "burst": {
        "groups": 16,
        "users": 16,
        "system_words": (400, 800),
        "rate": 4.0,
        "seconds": 40.0,
        # every 8 s, one group (the next one each time) is hot for 3 s at 24 requests/s: 2 sequences of
        # 32 tokens at a time make an engine serve ~28 cached requests/s, so the hot group's engine is
        # nearly full and queues while the other three idle, unless the hot prefix gets a second holder
        "bursts": (8.0, 3.0, 24.0),
        "max_num_seqs": 2,
        "max_tokens": 32,
        # 16 prompts of 600 tokens: ~600 blocks of 16; a third of them per engine
        "kv_cache_blocks": 200,
    },
}


def pin_balanced(weights: list[float], engines: int) -> list[int]:
    """Each group's engine: hottest first, each to the engine with the least expected load so far (for
    equal weights, group g to engine g mod `engines`)."""
    load = [0.0] * engines
    pin = [0] * len(weights)
    for g in sorted(range(len(weights)), key=lambda g: -weights[g]):
        e = min(range(engines), key=lambda e: load[e])
        pin[g] = e
        load[e] += weights[g]
    return pin


class Workload:
    """Prompts for one target: fresh system prompts, the same arrival schedule for every target. With
    `multi_turn`, a user's request is its next turn: its earlier questions and (fixed) answers, then a
    new question, so each turn's prompt extends the one before."""

    def __init__(self, args: argparse.Namespace, prompt_seed: int, engines: int = ENGINES) -> None:
        rng = random.Random(prompt_seed)
        low, high = args.system_words
        # Each group's size comes from the run's seed, its words from the target's: every target gets
        # fresh prompts (what an earlier target cached is junk to it) of the same sizes, so every target,
        # the oracle included, meets the same working set against the same caches. (Sizes drawn from
        # the prompt seed made the targets after the oracle meet other working sets: on one sweep draw
        # the third target's was enough larger to thrash whatever routed it, 25-38x the oracle.)
        sizes = random.Random(f"group-sizes-{args.seed}")
        words = [sizes.randint(low, high) for _ in range(args.groups)]
        # a prefix common to every group (rag's system prompt, agentic's tool prompt), then the group's own
        self.shared = system_prompt(rng, args.shared_words) if args.shared_words else ""
        self.systems = [f"Group {g} instructions. " + system_prompt(rng, n) for g, n in enumerate(words)]
        self.rag = bool(args.shared_words) and not args.multi_turn
        self.turn_words: tuple[int, int] | None = args.turn_words
        self.turn_rng_seed = prompt_seed
        self.size_seed = args.seed
        self.users = args.users
        self.max_tokens = args.max_tokens
        self.multi_turn = args.multi_turn
        self.weights = [1.0 / (g + 1) ** args.zipf for g in range(args.groups)]
        self.pin = pin_balanced(self.weights, engines)
        sched = random.Random(args.seed)  # the same arrivals and choices for every target
        self.schedule: list[tuple[float, int, int]] = []
        t = 0.0
        while len(self.schedule) < args.max_requests:
            t += sched.expovariate(args.rate)
            if t > args.seconds:
                break
            if args.zipf:
                group = sched.choices(range(args.groups), self.weights)[0]
            else:
                group = sched.randrange(args.groups)
            self.schedule.append((t, group, sched.randrange(args.users)))
        if args.bursts is not None:  # flash crowds on top: group b % groups hot during the b-th burst
            every, length, burst_rate = args.bursts
            b = 0
            while (b + 1) * every - length < args.seconds:
                t = (b + 1) * every - length
                while True:
                    t += sched.expovariate(burst_rate)
                    if t > min((b + 1) * every, args.seconds):
                        break
                    self.schedule.append((t, b % args.groups, sched.randrange(args.users)))
                b += 1
            self.schedule.sort()
            del self.schedule[args.max_requests :]
        # each scheduled request's turn in its user's conversation (0: the user's first request)
        seen: dict[tuple[int, int], int] = {}
        self.turns: list[int] = []
        for _, group, user in self.schedule:
            turn = seen.get((group, user), 0)
            self.turns.append(turn)
            seen[(group, user)] = turn + 1

    def warmup(self) -> list[tuple[int, int, int]]:
        """Each group once, in order: (group, user, request index < 0)."""
        return [(g, 0, -1 - g) for g in range(len(self.systems))]

    def turn_text(self, group: int, user: int, k: int) -> str:
        """Turn `k`'s addition to a session (agentic): the same words whenever that turn is replayed."""
        if self.turn_words is None:
            return f"I am user {user} of group {group}. Question {k}?"
        rng = random.Random(f"{self.turn_rng_seed}/{group}/{user}/{k}")
        size = random.Random(f"{self.size_seed}/{group}/{user}/{k}").randint(*self.turn_words)  # as above
        return f"Step {k} of session {group}: " + system_prompt(rng, size)

    def body(self, group: int, user: int, i: int) -> bytes:
        turn = self.turns[i] if self.multi_turn and 0 <= i < len(self.turns) else 0
        messages: list[dict[str, str]]
        if self.rag:  # the shared system prompt, then the document and a question of this request's own
            question = f"Document {group} above. Question {i} from reader {user}?"
            messages = [
                {"role": "system", "content": self.shared},
                {"role": "user", "content": f"{self.systems[group]}\n\n{question}"},
            ]
        else:
            system = f"{self.shared} {self.systems[group]}" if self.shared else self.systems[group]
            messages = [{"role": "system", "content": system}]
            for k in range(turn):
                messages.append({"role": "user", "content": self.turn_text(group, user, k)})
                messages.append(
                    {"role": "assistant", "content": f"Answer {k} to user {user}: the sea says hush."}
                )
            if self.multi_turn:
                question = self.turn_text(group, user, turn)
            else:
                question = f"I am user {user} of group {group}. Question {i}?"
            messages.append({"role": "user", "content": question})
        return orjson.dumps(
            {
                "model": MODEL,
                "messages": messages,
                "max_tokens": self.max_tokens,
                "temperature": 0,
                "stream": True,
            }
        )


FIRST_TOKEN = re.compile(rb'"content":"[^"]')


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    limits: aiohttp.ClientTimeout,
    on_first_token: Callable[[], None] | None = None,
) -> Sample:
    """One streamed request; TTFT is the arrival of the first event with generated text (the role-only
    first event comes before prefill, as vLLM sends it)."""
    start = time.perf_counter()
    ttft: float | None = None
    try:
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json"}, timeout=limits
        ) as resp:
            done = False
            async for chunk in resp.content.iter_any():
                if ttft is None and FIRST_TOKEN.search(chunk):
                    ttft = time.perf_counter() - start
                    if on_first_token is not None:
                        on_first_token()
                if b"data: [DONE]" in chunk:
                    done = True
            ok = resp.status == 200 and done
            return Sample(ok, time.perf_counter() - start, ttft, resp.status, "" if ok else "no [DONE]")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Sample(False, time.perf_counter() - start, ttft, 0, type(exc).__name__)
    finally:
        if ttft is None and on_first_token is not None:
            on_first_token()  # the request's prefill is no longer outstanding either way


def engine_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {"queries": 0.0, "hits": 0.0, "requests": 0.0}
    names = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:request_success_total": "requests",
    }
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def prefix_keys_held(router: str) -> list[int] | None:
    """Per endpoint, how many prefix keys the router's memory says it holds (its /v1/fleet)."""
    try:
        with urllib.request.urlopen(router + "/v1/fleet", timeout=5) as resp:
            fleet = orjson.loads(resp.read())
    except OSError:
        return None
    return [int((e.get("prefix_memory") or {}).get("keys", 0)) for e in fleet.get("endpoints", [])]


class Chooser(Protocol):
    """Which of a target's urls serves request `i` of `group` (i < 0: a warm-up request)."""

    def choose(self, i: int, group: int) -> int: ...

    def first_token(self, i: int) -> None: ...


class RandomReplica:
    """Router replicas behind a random splitter."""

    def __init__(self, urls: int) -> None:
        self.urls = urls
        self.rng = random.Random(7)

    def choose(self, i: int, group: int) -> int:
        return self.rng.randrange(self.urls)

    def first_token(self, i: int) -> None:
        pass


class PinnedGroups:
    """The oracle: each group to its engine, straight to the engines."""

    def __init__(self, pin: list[int]) -> None:
        self.pin = pin

    def choose(self, i: int, group: int) -> int:
        return self.pin[group]

    def first_token(self, i: int) -> None:
        pass


class Replayed(Protocol):
    """What `run_target` sends: `Workload` or `mooncake_trace.TraceWorkload`."""

    schedule: list[tuple[float, int, int]]

    def warmup(self) -> list[tuple[int, int, int]]: ...

    def body(self, group: int, user: int, i: int) -> bytes: ...


async def run_target(
    name: str,
    urls: list[str],
    work: Replayed,
    bound_s: float,
    chooser: Chooser,
    warm_concurrency: int = 1,
    warmed: Callable[[], None] | None = None,
) -> Report:
    """Send the workload's warm-up (`warm_concurrency` requests at a time), then (after calling `warmed`)
    its schedule, each request to the url `chooser` picks."""
    for u in urls:
        check_loopback(u)
    paths = [u + "/v1/chat/completions" for u in urls]
    limits = aiohttp.ClientTimeout(total=bound_s)
    report = Report(name)

    async def send(session: aiohttp.ClientSession, i: int, group: int, user: int) -> Sample:
        url = paths[chooser.choose(i, group) % len(paths)]
        return await stream_one(
            session, url, work.body(group, user, i), limits, lambda: chooser.first_token(i)
        )

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        warm = work.warmup()
        for k in range(0, len(warm), warm_concurrency):
            await asyncio.gather(*(send(session, i, g, u) for g, u, i in warm[k : k + warm_concurrency]))
        if warmed is not None:
            warmed()
        start = time.perf_counter()
        tasks: list[asyncio.Task[Sample]] = []
        for i, (at, group, user) in enumerate(work.schedule):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, i, group, user)))
        report.samples = list(await asyncio.gather(*tasks))
        report.wall = time.perf_counter() - start
    return report


@dataclass(frozen=True)
class TargetSpec:
    """One target: the oracle or the reference (the load generator places, straight to the engines), a
    corral router (`replicas` of them behind a random splitter, `workers` processes each, None: the
    router's default; `deployed`: the router's defaults, no policy config), or vllm-router."""

    name: str
    kind: str  # "oracle", "reference", "corral" or "vllm-router"
    policy: str = ""
    replicas: int = 1
    workers: int | None = 1
    kv_events: bool = False
    deployed: bool = False
    peered: bool = False  # the replicas `--peer` one another (they share their picks)


ORACLE = TargetSpec("oracle", "oracle")
# Issue 17's targets, as they were (names included: RESULTS.md's tables quote them).
PRESET_TARGETS = [
    ORACLE,
    TargetSpec("corral round_robin", "corral", "round_robin"),
    TargetSpec("corral least_request", "corral", "least_request"),
    TargetSpec("corral prefix", "corral", "prefix"),
    TargetSpec("corral prefix (ring)", "corral", "prefix-ring"),
    TargetSpec("corral prefix x2 replicas", "corral", "prefix", replicas=2),
    TargetSpec("corral prefix --workers 2", "corral", "prefix", workers=2),
]
PRESET_KV_TARGETS = [
    TargetSpec("corral prefix kv-events", "corral", "prefix", kv_events=True),
    TargetSpec("corral prefix kv-events x2 replicas", "corral", "prefix", replicas=2, kv_events=True),
]
# Issue 28's: the prefix policy as a user deploys it (`corral router --backend ... --policy prefix`, no
# other flag: as many workers as CPUs), beside one and two workers and two and four single-process replicas.
DEPLOYED_TARGETS = [
    ORACLE,
    TargetSpec("corral prefix (deployed)", "corral", "prefix", workers=None, deployed=True),
    TargetSpec("corral prefix --workers 1", "corral", "prefix"),
    TargetSpec("corral prefix --workers 2", "corral", "prefix", workers=2),
    TargetSpec("corral prefix x2 replicas", "corral", "prefix", replicas=2),
    TargetSpec("corral prefix x4 replicas", "corral", "prefix", replicas=4),
    TargetSpec("corral round_robin", "corral", "round_robin"),
    # issue 28 item 2: the replicas share their picks (`--peer` each other)
    TargetSpec("corral prefix x2 replicas peered", "corral", "prefix", replicas=2, peered=True),
    TargetSpec("corral prefix x4 replicas peered", "corral", "prefix", replicas=4, peered=True),
]
DEPLOYED_KV_TARGETS = [
    TargetSpec(s.name.replace("corral prefix", "corral prefix kv-events"), "corral", "prefix", s.replicas,
               s.workers, kv_events=True, deployed=s.deployed, peered=s.peered)
    for s in DEPLOYED_TARGETS
    if s.policy == "prefix"
]  # fmt: skip
VLLM_ROUTER_TARGETS = [
    TargetSpec("vllm-router cache_aware", "vllm-router", "cache_aware"),
    TargetSpec("vllm-router round_robin", "vllm-router", "round_robin"),
]


def corral_router(
    port: int,
    sims: list[Proc],
    policy: str,
    config: Path | None,
    out: Path,
    tag: str,
    kv_events: list[str] | None = None,
    workers: int | None = 1,
    peers: list[str] | None = None,
) -> Proc:
    """A router over the sims; with `kv_events` (each sim's event address), it reads their KV events;
    `workers` router processes on one port (None: no --workers flag, the router's default); `peers`:
    the other replicas' URLs, whose picks it shares (one secret in `out`)."""
    argv = [sys.executable, "-m", "corral", "router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--policy", policy, "--log-level", "warning"]
    if peers:
        token = out / "peer.token"
        if not token.exists():
            token.write_text(secrets.token_hex(16) + "\n")
        argv += ["--peer-token-file", str(token)]
        for peer in peers:
            argv += ["--peer", peer]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if config is not None:
        argv += ["--policy-config", str(config)]
    if kv_events is None:
        for s in sims:
            argv += ["--backend", s.url]
    else:
        backends = out / f"{tag}-backends.txt"
        lines = [f"{s.url} kv_events={addr}" for s, addr in zip(sims, kv_events, strict=True)]
        backends.write_text("\n".join(lines) + "\n")
        argv += ["--backends-file", str(backends), "--tokenizer", "sim"]
    # $CORRAL_ROUTER_WORKERS would set the default's worker count: a deployed router has none
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_ROUTER_WORKERS"}
    return spawn(tag, argv, f"http://127.0.0.1:{port}", None, out, env)


def words_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


class Fleet:
    """The simulated engines of one run (with `kv_events`, each publishing its KV-cache events), and the
    policy configs the corral targets read. `start` is the one place that knows the engines are sims
    (bench_prefix_vllm.py starts real vLLM engines instead)."""

    # the engines' counters are read before the target's warm-up (False) or after it (True: hit rate and
    # load spread over the measured phase alone)
    counters_after_warmup = False

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.sims: list[Proc] = []
        self.events: list[str] | None = [] if args.kv_events else None
        self.config = out / "prefix-policy.yaml"
        self.config.write_text(f"eps: {args.eps}\nscrape_interval: {args.scrape_interval}\n")
        # the placement before issue 17: ring homes and the strict load bound, under its own policy name
        self.ring_config = out / "prefix-ring-policy.yaml"
        self.ring_config.write_text(
            f"eps: {args.eps}\nscrape_interval: {args.scrape_interval}\npolicy: prefix-ring\n"
            "policies:\n  prefix-ring:\n    placement: ring\n"
            "    weights: {prefix: 1.0, queue: 0.2, in_flight: 0.15, kv_usage: 0.1}\n"
        )

    def start(self) -> None:
        args = self.args
        sim_args = [
            "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-blocks", str(args.kv_cache_blocks),
            "--block-size", "16", "--prefill-ms-per-token", str(args.prefill_ms_per_token),
            "--ttft-base-ms", "2", "--itl-ms", "2", "--max-model-len", str(args.max_model_len),
        ]  # fmt: skip
        for i in range(ENGINES):
            port = free_port()
            argv = [sys.executable, "-m", "corral", "sim", "--host", "127.0.0.1", "--port", str(port)]
            argv += ["--model", MODEL, "--seed", str(i), *sim_args]
            if self.events is not None:
                # the sim binds its publisher on a wildcard (vLLM connects out to any other tcp address)
                # and the routers connect to it, replaying what they missed from the replay socket
                pub, replay = free_port(), free_port()
                self.events.append(f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}")
                kv_config = {
                    "enable_kv_cache_events": True,
                    "publisher": "zmq",
                    "endpoint": f"tcp://*:{pub}",
                    "replay_endpoint": f"tcp://*:{replay}",
                }
                argv += ["--kv-events-config", orjson.dumps(kv_config).decode()]
            self.sims.append(spawn(f"prefix-sim-{i}", argv, f"http://127.0.0.1:{port}", None, self.out))
        for s in self.sims:
            wait_ready(s, "/health")

    def stop(self) -> None:
        for s in reversed(self.sims):
            s.stop()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.sims]

    def routers(self, spec: TargetSpec, vllm_router: str | None) -> list[Proc]:
        """Start the target's routers and wait until they serve; none for the oracle and the reference."""
        routers: list[Proc] = []
        try:
            if spec.kind == "vllm-router":
                assert vllm_router is not None
                port = free_port()
                argv = [vllm_router, "--host", "127.0.0.1", "--port", str(port), "--policy", spec.policy]
                argv += ["--worker-urls", *self.urls]
                # its metrics listener on a free loopback port (its default, 29000, may be taken)
                argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
                tag = f"prefix-vllm-router-{spec.policy}"
                routers.append(spawn(tag, argv, f"http://127.0.0.1:{port}", None, self.out))
                wait_ready(routers[0], "/v1/models")
            elif spec.kind == "corral":
                ring = spec.policy == "prefix-ring"
                config = None if spec.deployed else self.ring_config if ring else self.config
                kv = self.events if spec.kv_events else None
                ports = [free_port() for _ in range(spec.replicas)]
                for r, port in enumerate(ports):
                    workers = "d" if spec.workers is None else spec.workers
                    peered = "-peered" if spec.peered else ""
                    tag = f"prefix-corral-{spec.policy}{'-kv' if kv else ''}-w{workers}{peered}-{r}"
                    policy = "prefix" if ring else spec.policy
                    peers = [f"http://127.0.0.1:{p}" for p in ports if p != port] if spec.peered else None
                    routers.append(
                        corral_router(port, self.sims, policy, config, self.out, tag, kv, spec.workers, peers)
                    )
                for router in routers:
                    wait_ready(router, "/health")
        except BaseException:
            for router in routers:
                router.stop()
            raise
        return routers

    def measure(
        self,
        spec: TargetSpec,
        work: Replayed,
        chooser: Chooser | None,
        vllm_router: str | None,
        warm_concurrency: int = 1,
    ) -> dict[str, Any]:
        """Run one target; its row: TTFT, throughput, the engines' hit rate and load spread over the run.
        `chooser` places requests for the oracle and the reference (None: random over router replicas)."""
        routers = self.routers(spec, vllm_router)
        try:
            time.sleep(0.5)  # first metrics scrape, first model probe
            before = [engine_counters(u) for u in self.urls]

            def warmed() -> None:
                if self.counters_after_warmup:
                    before[:] = [engine_counters(u) for u in self.urls]

            urls = [r.url for r in routers] if routers else self.urls
            pick = chooser if chooser is not None else RandomReplica(len(urls))
            report = uvloop.run(run_target(spec.name, urls, work, 120.0, pick, warm_concurrency, warmed))
            after = [engine_counters(u) for u in self.urls]
            held = [prefix_keys_held(r.url) for r in routers] if spec.kind == "corral" else []
        finally:
            for router in routers:
                router.stop()
        # The warm-up is inside the counter window; take it out of the request counts it adds.
        requests = [a["requests"] - b["requests"] for a, b in zip(after, before, strict=True)]
        queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
        hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
        mean = sum(requests) / len(requests)
        row: dict[str, Any] = {
            "target": spec.name,
            "requests": len(report.samples),
            "errors": report.errors,
            "rps": round(report.rps, 1),
            "ttft_p50_ms": round(report.ttft_ms(0.5), 1),
            "ttft_p90_ms": round(report.ttft_ms(0.9), 1),
            "ttft_p99_ms": round(report.ttft_ms(0.99), 1),
            "hit_rate": round(hits / queries, 3) if queries else None,
            "per_engine": [int(r) for r in requests],
            "spread_max_over_mean": round(max(requests) / mean, 2) if mean else None,
        }
        if held:  # prefixes each endpoint holds by the router's memory: 12 when none was replicated
            row["prefix_keys_held"] = held
        if report.errors:
            row["error_kinds"] = report.error_kinds()
        return row


def warm_engines(
    fleet: Fleet, args: argparse.Namespace, requests: int = 8 * ENGINES, at_once: bool = False
) -> None:
    """A first pass straight to the sims, so that no target (the oracle runs first) meets cold engines;
    `at_once`: the requests all at the start, not at their scheduled times."""
    warm = Workload(args, prompt_seed=999, engines=len(fleet.urls))
    warm.schedule = [(0.0 if at_once else t, g, u) for t, g, u in warm.schedule[:requests]]
    uvloop.run(run_target("warm-up", fleet.urls, warm, 120.0, PinnedGroups(warm.pin)))


def selected(specs: list[TargetSpec], only: str) -> list[TargetSpec]:
    names = {t.strip() for t in only.split(",") if t.strip()}
    return [s for s in specs if not names or s.name in names]


def markdown_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


ROW_COLUMNS = ["target", "requests", "errors", "rps", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
               "hit_rate", "per_engine", "spread_max_over_mean"]  # fmt: skip


def run_presets(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Issue 17's runs: one workload (the default or a preset), every target."""
    vr = find_vllm_router(args.vllm_router)
    specs = PRESET_TARGETS + (PRESET_KV_TARGETS if args.kv_events else [])
    if vr:
        specs += VLLM_ROUTER_TARGETS
    else:
        print("vllm-router not found: run benchmarks/setup.sh to compare against it", file=sys.stderr)
    # issue 28's targets (the deployed router, one worker, four replicas) last, so that the others keep
    # their order and prompt seeds
    names = {s.name for s in specs}
    specs += [
        s
        for s in DEPLOYED_TARGETS + DEPLOYED_KV_TARGETS
        if s.name not in names and (args.kv_events or not s.kv_events)
    ]
    chosen = selected(specs, args.only)
    fleet = Fleet(args, out)
    results: list[dict[str, Any]] = []
    try:
        fleet.start()
        warm_engines(fleet, args)
        for k, spec in enumerate(specs):
            if spec not in chosen:
                continue  # k stays each target's prompt seed whichever targets run
            work = Workload(args, prompt_seed=1000 + k)
            chooser = PinnedGroups(work.pin) if spec.kind == "oracle" else None
            row = fleet.measure(spec, work, chooser, vr)
            results.append(row)
            print(orjson.dumps(row).decode(), flush=True)
    finally:
        fleet.stop()
    by = {r["target"]: r for r in results}
    oracle = by.get("oracle")
    for r in results:
        if oracle and oracle["ttft_p90_ms"] and r is not oracle:
            print(f"{r['target']}: TTFT p90 / oracle's = {r['ttft_p90_ms'] / oracle['ttft_p90_ms']:.2f}x")
    prefix, rr, ca = by.get("corral prefix"), by.get("corral round_robin"), by.get("vllm-router cache_aware")
    two = by.get("corral prefix x2 replicas")
    if prefix and rr and prefix["ttft_p90_ms"]:
        print(f"TTFT p90 round_robin / prefix = {rr['ttft_p90_ms'] / prefix['ttft_p90_ms']:.1f}x")
    if prefix and ca and prefix["ttft_p90_ms"]:
        ratio = ca["ttft_p90_ms"] / prefix["ttft_p90_ms"]
        print(f"TTFT p90 vllm-router cache_aware / corral prefix = {ratio:.2f}x")
    if prefix and two and prefix["hit_rate"]:
        print(f"hit rate two replicas / one = {two['hit_rate'] / prefix['hit_rate']:.3f}")
    if args.markdown:
        markdown_table(results, ROW_COLUMNS)
    return results


def run_sweep(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """`--sweep N`: N draws of the randomized family (prefix_sweep), each on a fresh fleet; per draw
    every target's TTFT p90 and hit rate against the oracle's, then the median and worst per target."""
    specs = selected(DEPLOYED_TARGETS + (DEPLOYED_KV_TARGETS if args.kv_events else []), args.only)
    indices = [int(i) for i in args.sweep_draws.split(",")] if args.sweep_draws else range(args.sweep)
    print(f"sweep: seed {args.sweep_seed}, draws {list(indices)}, {args.seconds} s of load each", flush=True)
    per_draw: list[dict[str, prefix_sweep.DrawRatios]] = []
    results: list[dict[str, Any]] = []
    for index in indices:
        d = prefix_sweep.draw(
            args.sweep_seed, index, ENGINES, args.max_num_seqs, args.max_tokens, args.prefill_ms_per_token
        )
        print(f"draw {d.describe()}", flush=True)
        draw_args = argparse.Namespace(**{**vars(args), **d.settings()})
        fleet = Fleet(draw_args, out)
        rows: list[dict[str, Any]] = []
        try:
            fleet.start()
            warm_engines(fleet, draw_args, ENGINES, at_once=True)
            for k, spec in enumerate(specs):
                work = Workload(draw_args, prompt_seed=1000 + k)
                chooser = PinnedGroups(work.pin) if spec.kind == "oracle" else None
                row = fleet.measure(spec, work, chooser, None, warm_concurrency=ENGINES)
                rows.append(row)
        finally:
            fleet.stop()
        ratios = prefix_sweep.ratios(rows)
        per_draw.append(ratios)
        oracle = rows[0] if rows and rows[0]["target"] == "oracle" else None
        if oracle:
            print(f"  oracle: p90 {oracle['ttft_p90_ms']} ms, hit {oracle['hit_rate']}, "
                  f"{oracle['requests']} requests")  # fmt: skip
        for name, r in ratios.items():
            row = next(x for x in rows if x["target"] == name)
            delta = "n/a" if r.hit_delta is None else f"{r.hit_delta:+.3f}"
            print(f"  {name}: p90 x{r.p90_ratio}, hit {row['hit_rate']} ({delta}), "
                  f"errors {row['errors']}", flush=True)  # fmt: skip
        results.append({"draw": vars(d) | {"system_words": list(d.system_words)}, "rows": rows})
    summary = prefix_sweep.summary(per_draw)
    print(f"summary over {len(per_draw)} draws (sweep seed {args.sweep_seed}): TTFT p90 / the oracle's, "
          "hit rate - the oracle's")  # fmt: skip
    markdown_table(summary, ["target", "draws", "p90_ratio_median", "p90_ratio_worst",
                             "hit_delta_median", "hit_delta_worst"])  # fmt: skip
    return [{"sweep_seed": args.sweep_seed, "draws": results, "summary": summary}]


def run_trace(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """`--workload mooncake`: the trace replayed (mooncake_trace) against every target, the cost-model
    reference, and vllm-router when installed; ratios to the reference."""
    path = Path(args.trace)
    if not path.exists():
        raise SystemExit(
            f"bench_prefix: no trace at {path}; make it as benchmarks/data/README.md says "
            "(fetch kvcache-ai/Mooncake, then mooncake_trace.py cut), or pass --trace FILE"
        )
    requests = mooncake_trace.load_trace(path, args.trace_requests)
    scale = mooncake_trace.TraceScale(args.trace_block_words, args.trace_speedup, args.trace_output_divisor)
    working_set_blocks = math.ceil(scale.working_set_words(requests) / 16)
    if args.kv_cache_blocks == parser_defaults()["kv_cache_blocks"]:
        args.kv_cache_blocks = math.ceil(args.trace_cache_fraction * working_set_blocks / ENGINES)
    longest = max(r.input_length for r in requests) * scale.block_words / mooncake_trace.TRACE_BLOCK_TOKENS
    args.max_model_len = max(args.max_model_len, 2 ** math.ceil(math.log2(longest + 512)))
    span = requests[-1].at_ms - requests[0].at_ms
    print(f"trace: {len(requests)} requests of {path} over {span / 1000:.0f} s, replayed over "
          f"{span / 1000 / scale.speedup:.0f} s; {scale.block_words} words per 512-token block, outputs / "
          f"{scale.output_divisor}; working set {working_set_blocks} blocks of 16, {args.kv_cache_blocks} "
          f"per engine ({ENGINES * args.kv_cache_blocks / working_set_blocks:.2f}x in all), "
          f"{args.max_num_seqs} sequences per engine", flush=True)  # fmt: skip
    vr = find_vllm_router(args.vllm_router)
    reference = TargetSpec("reference", "reference")
    specs = [reference, *DEPLOYED_TARGETS, *(DEPLOYED_KV_TARGETS if args.kv_events else [])]
    specs += VLLM_ROUTER_TARGETS if vr else []
    if not vr:
        print("vllm-router not found: run benchmarks/setup.sh to compare against it", file=sys.stderr)
    fleet = Fleet(args, out)
    results: list[dict[str, Any]] = []
    try:
        fleet.start()
        warm_engines(fleet, args)
        for k, spec in enumerate(selected(specs, args.only)):
            work = mooncake_trace.TraceWorkload(requests, scale, MODEL, 1000 + k, WORDS)
            work.pin = pin_balanced(work.weights, ENGINES)
            chooser: Chooser | None = None
            if spec.kind == "oracle":
                chooser = PinnedGroups(work.pin)
            elif spec.kind == "reference":
                capacity = args.kv_cache_blocks * 16 // scale.block_words
                chooser = mooncake_trace.CostModelReference(
                    requests, scale, ENGINES, capacity, args.prefill_ms_per_token, args.max_num_seqs
                )
            row = fleet.measure(spec, work, chooser, vr)
            results.append(row)
            print(orjson.dumps(row).decode(), flush=True)
    finally:
        fleet.stop()
    ref = next((r for r in results if r["target"] == "reference"), None)
    for r in results:
        if ref and ref["ttft_p90_ms"]:
            r["p90_over_reference"] = round(r["ttft_p90_ms"] / ref["ttft_p90_ms"], 2)
    markdown_table(results, [*ROW_COLUMNS, "p90_over_reference"])
    return results


def parser_defaults() -> dict[str, Any]:
    return vars(build_parser().parse_args([]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--workload",
        choices=("default", *PRESETS, "mooncake"),
        default="default",
        help="a preset (flags given win), or mooncake: the trace (--trace)",
    )
    parser.add_argument("--rate", type=float, default=40.0, help="Poisson arrival rate, requests/s")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured phase bound per target")
    parser.add_argument("--max-requests", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument(
        "--system-words", type=words_range, default=(500, 500), help="N or LOW-HIGH; about one token per word"
    )
    parser.add_argument("--multi-turn", action="store_true", help="a user's turn carries its earlier turns")
    parser.add_argument("--shared-words", type=int, default=0, help="a prefix common to every group")
    parser.add_argument(
        "--turn-words", type=words_range, default=None, help="LOW-HIGH words each turn appends (multi-turn)"
    )
    parser.add_argument("--zipf", type=float, default=0.0, help="group popularity exponent (0: uniform)")
    parser.add_argument(
        "--bursts",
        type=lambda text: tuple(float(x) for x in text.split(",")),
        default=None,
        help="EVERY,LENGTH,RATE: at the end of every EVERY seconds, LENGTH seconds of RATE requests/s more, "
        "all for one group (the next each time)",
    )
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-events", action="store_true", help="also route by the sims' KV-cache events")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-blocks", type=int, default=400, help="per engine, 16-token blocks")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.5)
    parser.add_argument("--eps", type=float, default=1.0, help="load bound of the corral prefix policy")
    parser.add_argument(
        "--scrape-interval", type=float, default=1.0, help="the routers' /metrics period (their default)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated target names to run (default: all)")
    parser.add_argument("--vllm-router", default=None)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out"))
    sweep = parser.add_argument_group("the randomized family (prefix_sweep.py)")
    sweep.add_argument("--sweep", type=int, default=0, help="N draws, each on fresh engines")
    sweep.add_argument("--sweep-seed", type=int, default=1, help="the seed each draw's seed derives from")
    sweep.add_argument("--sweep-draws", default="", help="I,J,...: only these draws of --sweep-seed")
    trace = parser.add_argument_group("--workload mooncake (mooncake_trace.py)")
    trace.add_argument("--trace", default=str(mooncake_trace.SUBSET), help="a Mooncake trace, JSON lines")
    trace.add_argument("--trace-requests", type=int, default=None, help="only the first N requests")
    trace.add_argument("--trace-block-words", type=int, default=32, help="words per 512-token block")
    trace.add_argument("--trace-speedup", type=float, default=20.0, help="arrivals this many times faster")
    trace.add_argument("--trace-output-divisor", type=int, default=8, help="outputs this many times shorter")
    trace.add_argument(
        "--trace-cache-fraction", type=float, default=0.5, help="the engines' caches together / working set"
    )
    return parser


# --sweep: each draw's load, seconds (a few seconds of load so that 20 draws fit in ~15 minutes on 2 cores)
SWEEP_SECONDS = 4.0
# --workload mooncake: the engines. A sim's prefill and decode share its compute (a decode step is
# stretched by the prefill batched with it), so an engine computes ~1/prefill_ms_per_token prompt tokens a
# second: at 0.2 ms, the fleet's 20k tokens/s is about twice what the subset asks at --trace-speedup 20
# with its hits, and 4 sequences per engine make the trace's bursts queue.
TRACE_ENGINE: dict[str, Any] = {"max_num_seqs": 4, "prefill_ms_per_token": 0.2}


def main() -> None:
    exit_on_sigterm()
    parser = build_parser()
    args = parser.parse_args()
    given = parser_defaults()
    if args.workload in PRESETS:
        for key, value in PRESETS[args.workload].items():
            if getattr(args, key) == given[key]:  # not set on the command line
                setattr(args, key, value)
    elif args.sweep and args.seconds == given["seconds"]:
        args.seconds = SWEEP_SECONDS
    elif args.workload == "mooncake":
        for key, value in TRACE_ENGINE.items():
            if getattr(args, key) == given[key]:
                setattr(args, key, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sweep or args.sweep_draws:
        results = run_sweep(args, out)
    elif args.workload == "mooncake":
        results = run_trace(args, out)
    else:
        results = run_presets(args, out)
    (out / "bench_prefix.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
