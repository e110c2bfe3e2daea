"""vLLM's command line as vLLM reads it: the settings a bundle is fingerprinted by (`--flag value` and
`--flag=value`, short aliases, `vllm serve MODEL`, the last occurrence wins) and the engine's API key
(the last `--api-key`, else VLLM_API_KEY; a given flag wins even when empty)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

API_KEY_FLAG = "--api-key"
API_KEY_ENV = "VLLM_API_KEY"

# flag -> setting name, for the settings that pin what an engine serves (ports, hosts, seeds do not)
VALUE_FLAGS: dict[str, str] = {
    "--model": "model",
    "--revision": "revision",
    "--code-revision": "code_revision",
    "--tokenizer": "tokenizer",
    "--tokenizer-revision": "tokenizer_revision",
    "--tokenizer-mode": "tokenizer_mode",
    "--dtype": "dtype",
    "--quantization": "quantization",
    "-q": "quantization",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--block-size": "block_size",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--data-parallel-size": "data_parallel_size",
    "-dp": "data_parallel_size",
    "--load-format": "load_format",
    "--model-loader-extra-config": "model_loader_extra_config",
    "--kv-transfer-config": "kv_transfer_config",
    "--kv-connector": "kv_connector",
    "--chat-template": "chat_template",
    "--chat-template-content-format": "chat_template_content_format",
    "--max-model-len": "max_model_len",
    "--served-model-name": "served_model_name",
}
SWITCHES: dict[str, str] = {
    "--enable-expert-parallel": "expert_parallel",
    "--trust-remote-code": "trust_remote_code",
    "--enable-sleep-mode": "sleep_mode",
    "--enable-lora": "lora",
}


def serving_settings(argv: Sequence[str]) -> dict[str, str | bool]:
    """The values of `VALUE_FLAGS` and `SWITCHES` in `argv` by setting name; `vllm serve MODEL` sets model."""
    settings: dict[str, str | bool] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=")
        if flag in VALUE_FLAGS:
            if eq:
                settings[VALUE_FLAGS[flag]] = inline
            elif i + 1 < len(args):
                settings[VALUE_FLAGS[flag]] = args[i + 1]
                i += 1
        elif arg in SWITCHES:
            settings[SWITCHES[arg]] = True
        elif arg == "serve" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            settings["model"] = args[i + 1]
            i += 1
        i += 1
    return settings


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last of `names` in `argv` (`--flag value` or `--flag=value`, as vLLM reads
    it), for the flags that size an engine rather than pin what it serves (`--gpu-memory-utilization`,
    `--data-parallel-size-local`, …); None when none of them is given."""
    found: str | None = None
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        if flag in names:
            if eq:
                found = inline
            elif i + 1 < len(argv):
                found = argv[i + 1]
    return found


def positive_int_flag(argv: Sequence[str], *names: str, default: int = 1) -> int:
    """The last of `names` in `argv` as a positive integer (a parallel size), `default` when absent;
    ValueError names the flag, the value and what to write."""
    value = flag_value(argv, *names)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(
            f"engine command: {names[0]} {value!r} is not a positive integer; give e.g. {names[0]} 2"
        )
    return number


def _values_after(argv: Sequence[str], i: int) -> list[str]:
    """The arguments that follow a bare `--api-key` at index `i`, up to the next option."""
    values: list[str] = []
    for arg in argv[i + 1 :]:
        if arg.startswith("-") and values:
            break
        values.append(arg)
        if arg.startswith("-"):  # a key may begin with "-" only as the flag's first value
            break
    return values


def api_key_values(argv: Sequence[str]) -> list[str] | None:
    """The values of the last `--api-key` (vLLM keeps the last occurrence); None when it is absent."""
    found: list[str] | None = None
    for i, arg in enumerate(argv):
        if arg == API_KEY_FLAG:
            found = _values_after(argv, i)
        elif arg.startswith(API_KEY_FLAG + "="):
            found = [arg.partition("=")[2]]
    return found


def engine_api_key(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The key the engine demands, or None when it demands none. As vLLM: a given `--api-key` wins over
    VLLM_API_KEY even when empty, and an empty key guards nothing."""
    values = api_key_values(argv)
    chosen = values if values is not None else [environ.get(API_KEY_ENV, "")]
    return next((key for key in chosen if key), None)


def loader_config(engine_argv: Sequence[str]) -> dict[str, Any]:
    """The engine's `--model-loader-extra-config` JSON object (the weight cache's mode and socket); {}
    when absent or not a JSON object."""
    raw = serving_settings(engine_argv).get("model_loader_extra_config")
    if not isinstance(raw, str):
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


_SHELLS = frozenset({"sh", "bash", "dash", "zsh"})


def daemon_words(daemon_argv: Sequence[str]) -> list[str]:
    """A preload daemon's command, with a `sh -c SCRIPT` wrapper read through (its words, as the shell
    would split them), so that a wrapped `exec vllm preload --model M …` is still compared."""
    if len(daemon_argv) >= 3 and Path(daemon_argv[0]).name in _SHELLS and daemon_argv[1] == "-c":
        try:
            return shlex.split(daemon_argv[2])
        except ValueError:
            return list(daemon_argv)
    return list(daemon_argv)
