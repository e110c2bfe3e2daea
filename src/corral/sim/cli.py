"""`corral sim`: run one vLLM-compatible engine simulator process; `corral sim preload`: its weight-cache
daemon.

`sim` is a group whose own options run the engine, so `corral sim --port 8000 ...` is unchanged. The
environment switches of vLLM are read here, once: VLLM_SERVER_DEV_MODE=1 mounts the development endpoints,
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true the LoRA load/unload endpoints, and VLLM_API_KEY (when no `--api-key`
is given) guards the `/v1` routes as vLLM does, and VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps the API server up
(503) after a rank died.

The simulator and the daemon (aiohttp, the engine model) are imported when a command runs, so that
`--help` starts fast.
"""

from __future__ import annotations

import math
import os
import sys

import click

from corral.engine import pd_protocol as pd
from corral.engine.kv_events import HASH_ALGOS, parse_kv_events_config
from corral.engine.sim_version import SIM_VLLM_VERSION


def _finite(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of milliseconds; give one from 0 to 1000")
    return value


def _check_requires(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    if not value:
        return value
    from corral.sim.weights.requires import Requirement

    for spec in value:
        try:
            Requirement.parse(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


def _check_lora_modules(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    if not value:
        return value
    from corral.sim.core.lora import parse_lora_module

    for spec in value:
        try:
            parse_lora_module(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


def _check_kv_transfer_config(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            pd.lease_seconds(pd.parse_kv_transfer_config(value))
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


def _check_kv_events_config(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_kv_events_config(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


def _flag(environ: dict[str, str], name: str) -> bool:
    """vLLM reads these switches as integer flags."""
    try:
        return bool(int(environ.get(name, "0")))
    except ValueError:
        return False


def _dev_mode(environ: dict[str, str]) -> bool:
    return _flag(environ, "VLLM_SERVER_DEV_MODE")


def _runtime_lora(environ: dict[str, str]) -> bool:
    return environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--model",
    default="sim-model",
    show_default=True,
    help="A model name, or a checkpoint directory (config.json, *.safetensors) sizing weights and KV.",
)
@click.option(
    "--served-model-name",
    default=None,
    help="The name /v1/models lists and requests use [default: --model].",
)
@click.option(
    "--max-model-len",
    default=None,
    type=click.IntRange(min=1),
    help="[default: the model directory's max_position_embeddings, else 2048]",
)
@click.option(
    "--max-num-seqs",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Running slots; more requests wait in a FIFO queue.",
)
@click.option(
    "--max-num-batched-tokens",
    default=2048,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens one engine step computes: the running decodes plus chunks of the prompts in prefill, "
    "which stretch those decode steps.",
)
@click.option(
    "--block-size",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens per KV-cache block: the unit of the prefix cache, KV events and KV transfers.",
)
@click.option(
    "--kv-cache-blocks",
    default=4096,
    show_default=True,
    type=click.IntRange(min=1),
    help="KV-cache capacity in blocks (x --block-size tokens); with --gpu-memory-gib, the blocks that "
    "fit the device instead.",
)
@click.option(
    "--startup-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Time from start to serving; the port is not bound before.",
)
@click.option(
    "--prefill-ms-per-token",
    default=0.05,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Prefill time per prompt token the prefix cache does not hold (also what a prefill chunk adds "
    "to the decode step it shares).",
)
@click.option(
    "--render-ms-per-token",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0, max=1000),
    callback=_finite,
    help="Time per prompt token the API server spends rendering and tokenizing a request before the "
    "engine core has it: vLLM's running and waiting gauges do not count the request meanwhile (a long "
    "prompt on a slow tokenizer).",
)
@click.option(
    "--enable-prompt-tokens-details",
    is_flag=True,
    help="As vLLM: each answer's usage says how many prompt tokens the prefix cache served "
    "(prompt_tokens_details.cached_tokens).",
)
@click.option(
    "--ttft-base-ms",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Fixed part of every prefill, on top of --prefill-ms-per-token per uncached prompt token.",
)
@click.option(
    "--itl-ms",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Inter-token latency of a lone request (grows with the batch).",
)
@click.option(
    "--default-max-tokens",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Upper bound of the drawn output length when a request gives no max_tokens.",
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=int,
    help="Seed of what is drawn (output text and lengths, --fail-rate and --fail-kv-transfer failures): "
    "the same seed and request give the same answer.",
)
@click.option(
    "--shutdown-timeout",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM, let in-flight requests finish for this long, then abort the rest.",
)
@click.option(
    "--fail-rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fraction of inference requests answered 500.",
)
@click.option(
    "--fail-rate-after",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="--fail-rate spares the first N inference requests (a bundle that passes its smoke tests and "
    "fails under real traffic).",
)
@click.option(
    "--crash-after",
    default=None,
    type=click.IntRange(min=0),
    help="Exit 1 when the (N+1)-th inference request arrives.",
)
@click.option(
    "--gpu-fault",
    default=None,
    type=click.Choice(["illegal-memory-access", "cuda-oom", "nccl-error", "nccl-timeout"]),
    help="The (--gpu-fault-after + 1)-th inference request dies of this GPU fault: the CUDA, out-of-memory "
    "or NCCL lines vLLM and torch print, then exit 1.",
)
@click.option(
    "--gpu-fault-after",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Inference requests served before --gpu-fault (0: the first one, the supervisor's smoke request).",
)
@click.option(
    "--hang-after",
    default=None,
    type=click.IntRange(min=0),
    help="Inference requests after the N-th never produce a token (/health stays 200).",
)
@click.option(
    "--wrong-answer",
    default=None,
    type=click.Choice(["other-model", "error-body", "no-choices"]),
    help="Inference requests after --wrong-answer-after answer 200 with a body that is no completion of "
    "this model: other-model (a completion naming another model), error-body (an error object), "
    "no-choices (choices: []); what a broken proxy or the wrong engine on the port gives.",
)
@click.option(
    "--wrong-answer-after",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Inference requests answered properly before --wrong-answer (1: the supervisor's first smoke).",
)
@click.option(
    "--fail-reload-rank",
    default=None,
    type=click.IntRange(min=0),
    help="collective_rpc reload_weights raises in this worker rank (it logs 'WorkerProc hit an "
    "exception.'; the API answers vLLM's 500 'Worker failed with error ...'); the other ranks reload.",
)
@click.option(
    "--fail-wake-tag",
    "fail_wake_tags",
    multiple=True,
    type=click.Choice(["weights", "kv_cache"]),
    help="A /wake_up that would wake this tag fails in the worker (as a CUDA OOM would); repeatable.",
)
@click.option(
    "--fail-sleep",
    is_flag=True,
    help="A /sleep at level 1 or 2 pauses the scheduler, then fails in the worker (as a CUDA error while "
    "offloading would), leaving the engine paused with every allocation resident.",
)
@click.option(
    "--fail-lora-kv-blocks",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Each runtime LoRA load takes this many blocks off the KV cache (vllm:cache_config_info's "
    "num_gpu_blocks drops), as an engine whose adapter memory was not reserved at start would.",
)
@click.option(
    "--requires",
    "requires",
    multiple=True,
    callback=_check_requires,
    metavar="SPEC",
    help="unix:/path, tcp:host:port, file:/path or a path that must be there at engine init.",
)
@click.option("--version-string", default=SIM_VLLM_VERSION, show_default=True, help="What /version reports.")
@click.option(
    "--enable-sleep-mode",
    is_flag=True,
    help="Put weights and KV cache in the sleep allocator's pool, so /sleep frees them.",
)
@click.option(
    "--weights-gib",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Simulated size of a named model's weights (a model directory's are its *.safetensors sizes); "
    "divided among --tensor-parallel-size ranks.",
)
@click.option(
    "--kv-cache-gib",
    default=None,
    type=click.FloatRange(min=0),
    help="Simulated KV cache memory [default: KV tokens x 128 KiB].",
)
@click.option(
    "--memory-metrics/--no-memory-metrics",
    default=True,
    show_default=True,
    help="Expose the corral_sim_* memory gauges; --no-memory-metrics hides them, as vLLM has none "
    "(its GPU memory is read from the device).",
)
@click.option(
    "--gpu-memory-gib",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Memory of the simulated GPU (each rank's); a start that does not fit fails as vLLM's does "
    "[default: no device, no memory arithmetic].",
)
@click.option(
    "--gpu-memory-utilization",
    default=0.9,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True),
    help="Share of the simulated GPU the engine may use (weights, overhead, KV cache).",
)
@click.option(
    "--tensor-parallel-size",
    "-tp",
    "tensor_parallel_size",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Ranks; 2 or more run one worker process per rank.",
)
@click.option(
    "--dtype",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "half", "float16", "bfloat16", "float", "float32"]),
    help="As vLLM: auto is the checkpoint's (float32 as bfloat16); with --kv-cache-dtype auto it sets "
    "the KV cache's bytes per token.",
)
@click.option(
    "--kv-cache-dtype",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]),
    help="As vLLM: auto is the model's dtype, fp8 is fp8_e4m3; sets the KV cache's bytes per token, so "
    "how many blocks fit --gpu-memory-gib.",
)
@click.option(
    "--fail-rank",
    default=None,
    type=click.IntRange(min=0),
    help="This worker rank dies (an NCCL error, exit 1) --fail-rank-after-seconds after serving starts.",
)
@click.option(
    "--fail-rank-after-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds after serving starts that the --fail-rank worker dies.",
)
@click.option(
    "--unlogged-rank",
    default=None,
    type=click.IntRange(min=0),
    help="This worker rank runs but logs nothing (no rank assignment line, no per-rank lines), as a rank "
    "whose log never reaches the supervisor: it cannot be seen.",
)
@click.option(
    "--engine-dead-exit-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="After a rank died: how long /health answers 503 before the server exits 1 (vLLM's watchdog "
    "period); VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it up.",
)
@click.option("--enable-lora", is_flag=True, help="Serve LoRA adapters.")
@click.option(
    "--max-loras",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="As vLLM; reported in the startup log and vllm:lora_requests_info (max_lora), not enforced.",
)
@click.option(
    "--lora-modules",
    "lora_modules",
    multiple=True,
    callback=_check_lora_modules,
    metavar="NAME=PATH",
    help="An adapter to load at startup (repeatable); PATH must be a directory.",
)
@click.option(
    "--load-format",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "ipc_cache"]),
    help="ipc_cache: take the weights from a `corral sim preload` daemon.",
)
@click.option(
    "--model-loader-extra-config",
    default=None,
    metavar="JSON",
    help='For ipc_cache: {"socket_path"|"socket_dir", "mode": "zero_copy"|"copy", "fallback": true, '
    '"connect_timeout_s", "state_timeout_s"}.',
)
@click.option("--revision", default=None, help="The model revision (a commit pins it); as vLLM.")
@click.option("--tokenizer-revision", default=None, help="The tokenizer revision; accepted as vLLM does.")
@click.option("--code-revision", default=None, help="The model code revision; accepted as vLLM does.")
@click.option("--quantization", "-q", default=None, help="The quantization method; accepted as vLLM does.")
@click.option("--chat-template", default=None, help="A chat template file or string; accepted as vLLM does.")
@click.option("--trust-remote-code", is_flag=True, help="Accepted as vLLM does.")
@click.option("--enforce-eager", is_flag=True, help="No CUDA graphs; accepted as vLLM does.")
@click.option(
    "--kv-transfer-config",
    default=None,
    metavar="JSON",
    callback=_check_kv_transfer_config,
    help='As vLLM takes it: {"kv_connector": "NixlConnector", "kv_role": "kv_producer"|"kv_consumer"|'
    '"kv_both"}; kv_connector_extra_config.kv_lease_duration (seconds, default 30) is how long a prefill\'s '
    "blocks wait to be pulled, kv_load_failure_policy (fail|recompute) what a failed pull does. A storage "
    'connector ("ExampleConnector", ...) answers no kv_transfer_params: its engines save and load prompts\' '
    "KV under kv_connector_extra_config.shared_storage_path (default /tmp).",
)
@click.option(
    "--kv-transfer-ms-per-block",
    default=0.1,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Simulated time to pull one KV block from the prefill engine (or load it from a shared store).",
)
@click.option(
    "--fail-kv-transfer",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fraction of pulls of this engine's held blocks that fail (the blocks stay held until the lease "
    "ends).",
)
@click.option(
    "--hang-kv-transfer",
    is_flag=True,
    help="Pulls of this engine's held blocks never complete; the lease frees the blocks and the pull fails.",
)
@click.option(
    "--kv-events-config",
    default=None,
    metavar="JSON",
    callback=_check_kv_events_config,
    help='As vLLM takes it: {"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": '
    '"tcp://*:5558", "buffer_steps": 10000, "hwm": 100000, "topic": ""}; the prefix cache publishes '
    "BlockStored / BlockRemoved / AllBlocksCleared on ZMQ, byte for byte as vLLM does.",
)
@click.option(
    "--prefix-caching-hash-algo",
    default="sha256",
    show_default=True,
    type=click.Choice(HASH_ALGOS),
    help="How block hashes are made (what KV events carry); PYTHONHASHSEED seeds them, as in vLLM.",
)
@click.option(
    "--api-key",
    "api_key",
    multiple=True,
    metavar="KEY",
    help="Requests to /v1... must carry `Authorization: Bearer KEY` (repeatable; wins over VLLM_API_KEY).",
)
@click.pass_context
def sim(ctx: click.Context, /, **options: object) -> None:
    """Run a vLLM-compatible engine simulator (or, with `preload`, its weight-cache daemon)."""
    if ctx.invoked_subcommand is not None:
        return
    from corral import aio
    from corral.sim.core.config import SimConfig
    from corral.sim.core.sizing import default_max_model_len
    from corral.sim.server import SimServer

    environ = dict(os.environ)
    if options["max_model_len"] is None:
        options["max_model_len"] = default_max_model_len(str(options["model"]))
    budget, seqs = options["max_num_batched_tokens"], options["max_num_seqs"]
    if budget < seqs:  # type: ignore[operator]
        raise click.BadParameter(
            f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs}); "
            "raise --max-num-batched-tokens or lower --max-num-seqs.",
            param_hint="--max-num-batched-tokens",
        )
    config = SimConfig(
        **options,  # type: ignore[arg-type]
        keep_alive_on_engine_death=_flag(environ, "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"),
        dev_mode=_dev_mode(environ),
        runtime_lora_updating=_runtime_lora(environ),
        env_api_key=environ.get("VLLM_API_KEY"),
        side_channel_host=environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST"),
        hash_seed=environ.get("PYTHONHASHSEED"),
    )
    sys.exit(aio.run(SimServer(config).run()))


@sim.command()
@click.option("--model", required=True, help="The model whose weights the daemon holds.")
@click.option(
    "--weight-cache-health-port", "health_port", default=None, type=int, help="Port of GET /health."
)
@click.option(
    "--weight-cache-health-host",
    "health_host",
    default="127.0.0.1",
    show_default=True,
    help="Address of GET /health (served only with --weight-cache-health-port).",
)
@click.option("--socket-path", default=None, help="The Unix socket to serve on.")
@click.option(
    "--weight-cache-socket-dir",
    "socket_dir",
    default=None,
    help="Directory of the socket (default: a per-user temp dir), when --socket-path is not given.",
)
@click.option(
    "--fingerprint",
    default=None,
    help="The weight identity it reports [default: from model and version]; another value stands in "
    "for another revision.",
)
@click.option(
    "--version-string",
    default=SIM_VLLM_VERSION,
    show_default=True,
    help="The vLLM version in the default --fingerprint: an engine whose --version-string differs gets "
    "a mismatch.",
)
@click.option(
    "--startup-seconds",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="How long loading the weights from disk takes.",
)
@click.option(
    "--weights-gib",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="GPU memory the cached weights take: what the daemon reports holding until they are released.",
)
@click.option(
    "--tensor-parallel-size",
    "-tp",
    "tensor_parallel_size",
    default=1,
    show_default=True,
    type=click.IntRange(min=1, max=64),
    help="Ranks (one process per GPU, as vLLM's launcher starts them); rank r > 0 serves PATH.rankR.sock.",
)
def preload(
    model: str,
    health_port: int | None,
    health_host: str,
    socket_path: str | None,
    socket_dir: str | None,
    fingerprint: str | None,
    version_string: str,
    startup_seconds: float,
    weights_gib: float,
    tensor_parallel_size: int,
) -> None:
    """Run a simulated vLLM weight-cache daemon (`vllm preload`): one rank process per GPU."""
    from corral import aio
    from corral.sim.core.config import GIB
    from corral.sim.weights.daemon_launcher import DaemonLauncher
    from corral.sim.weights.preload import DaemonConfig
    from corral.sim.weights.weight_cache import default_fingerprint, socket_path_in

    path = socket_path or socket_path_in(socket_dir)
    config = DaemonConfig(
        model=model,
        socket_path=path,
        fingerprint=fingerprint or default_fingerprint(model, version_string),
        socket_dir_arg=socket_dir or (os.path.dirname(socket_path) if socket_path else None),
        health_host=health_host,
        health_port=health_port,
        startup_seconds=startup_seconds,
        weights_bytes=int(weights_gib * GIB),
    )
    sys.exit(aio.run(DaemonLauncher(config, tensor_parallel_size).run()))
