"""The vLLM version `corral sim` reports (`/version`, its startup log, its default fingerprint) unless
given `--version-string`: PRECHECK predicts a simulated engine's version with it, without importing
the simulator."""

from __future__ import annotations

SIM_VLLM_VERSION = "0.33.0"
