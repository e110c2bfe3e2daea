"""Startup VERIFY of a preload-backed engine (issue 29 item 5; the runbook's Preload VERIFY: "the
engine's log shows the number of mapped tensors and the mode"): an engine started with `--load-format
ipc_cache` beside a preload daemon is READY only with vLLM's `Mapped N tensors from the weight cache
daemon (MODE mode)` line in its log, in the mode its loader config asks for — or with vLLM's disk
fallback warning, which is already engine evidence (counted, never silent). Neither line: nothing shows
where the weights came from, and the start fails naming the missing evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.engine.flags import loader_config, serving_settings
from corral.engine.weight_cache_log import MAPPED_LINE, WeightCacheLog


@dataclass(frozen=True)
class PreloadLoad:
    """Where the weights came from (`daemon`, `disk_fallback`, or None: not shown) and why not."""

    source: str | None
    problem: str | None
    evidence: dict[str, Any]


def verify_preload_load(engine_argv: Sequence[str], log: WeightCacheLog) -> PreloadLoad | None:
    """None when the engine does not load from a daemon (`--load-format` other than ipc_cache)."""
    if serving_settings(engine_argv).get("load_format") != "ipc_cache":
        return None
    mode = str(loader_config(engine_argv).get("mode", "zero_copy"))
    evidence: dict[str, Any] = {"expected_mode": mode, **log.to_json()}
    if log.mapped:
        modes = sorted({m.mode for m in log.mapped})
        if modes != [mode]:
            return PreloadLoad(
                "daemon",
                f"VERIFY: the engine mapped its weights in {'/'.join(modes)} mode, its loader config asks "
                f"for {mode}; fix --model-loader-extra-config and restart",
                evidence,
            )
        return PreloadLoad("daemon", None, evidence)
    if log.fallbacks:
        return PreloadLoad("disk_fallback", None, evidence)
    return PreloadLoad(
        None,
        f"VERIFY: the engine loads --load-format ipc_cache but its log has no '{MAPPED_LINE}' line "
        "(nor a disk-fallback warning): nothing shows where its weights came from; vLLM logs that line "
        "at INFO, so check that VLLM_LOGGING_LEVEL is INFO or DEBUG, and restart",
        evidence,
    )
