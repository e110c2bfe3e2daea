"""The engine flags PRECHECK reads to size a start, checked the way vLLM checks them, so a value the
engine would refuse is refused before it starts: parallel sizes, `--max-model-len` (with vLLM's k/K
suffixes), `--gpu-memory-utilization`, and the model the command serves (a directory, or a hub id's
cached snapshot)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.engine import flags as engine_flags
from corral.engine.flags import flag_value, serving_settings
from corral.engine.model_config import ModelConfig, hub_snapshot

DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default


class EngineArgError(ValueError):
    """An engine flag PRECHECK must read whose value vLLM would refuse too."""


def positive_int_flag(argv: Sequence[str], *names: str, default: int = 1) -> int:
    """The last of `names` in `argv` as a positive integer, `default` when absent."""
    try:
        return engine_flags.positive_int_flag(argv, *names, default=default)
    except ValueError as exc:
        raise EngineArgError(str(exc)) from exc


_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kmgtKMGT]?)$")


def max_model_len(value: str) -> int | None:
    """`--max-model-len` as vLLM reads it: an integer, or with a suffix (k/m/g/t decimal, K/M/G/T
    binary: 32k = 32000, 32K = 32768); -1 or auto (vLLM fits the longest context) is None."""
    if value in ("-1", "auto"):
        return None
    match = _HUMAN_INT.match(value)
    if match is None or (match[2] == "" and "." in match[1]) or (match[2].isupper() and "." in match[1]):
        raise EngineArgError(
            f"engine command: --max-model-len {value!r} is not a token count (e.g. 8192, 32k, 32K)"
        )
    power = "kmgt".index(match[2].lower()) + 1 if match[2] else 0
    base = 1024 if match[2].isupper() else 1000
    tokens = int(float(match[1]) * base**power)
    if tokens < 1:
        raise EngineArgError(f"engine command: --max-model-len {value!r} must be at least 1 token")
    return tokens


def utilization(argv: Sequence[str]) -> float:
    """`--gpu-memory-utilization`, vLLM's default 0.9; a value outside (0, 1] is refused as vLLM does."""
    value = flag_value(argv, "--gpu-memory-utilization")
    if value is None:
        return DEFAULT_UTILIZATION
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 1:
        raise EngineArgError(
            f"engine command: --gpu-memory-utilization {value!r} is not a fraction in (0, 1]; vLLM "
            "refuses it too: give the share of each GPU's memory the engine may use, e.g. 0.9"
        )
    return fraction


def model_directory(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str | None, Path | None]:
    """The model the command serves and its local directory: the path given, or the hub id's cached
    snapshot; (model, None) when the files are not on this host."""
    settings = serving_settings(argv)
    model = settings.get("model")
    if not isinstance(model, str):
        return None, None
    path = Path(model).expanduser()
    if path.is_dir():
        return model, path
    revision = settings.get("revision")
    return model, hub_snapshot(model, revision if isinstance(revision, str) else None, environ)


def check_context(tokens: int | None, config: ModelConfig, environ: Mapping[str, str]) -> None:
    """vLLM refuses a --max-model-len past the model's own context unless told to allow it."""
    derived = config.max_position_embeddings
    allowed = environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    if tokens is not None and derived is not None and tokens > derived and not allowed:
        raise EngineArgError(
            f"engine command: --max-model-len {tokens} is greater than the model's context ({derived}, "
            "config.json); vLLM refuses it: lower it, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the engine's "
            "environment if the model supports it"
        )
