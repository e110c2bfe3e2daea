"""The defaults of `WindowThresholds` (corral.contracts.traffic), apart from the model so that the
command lines offering them as flag defaults (`corral verify`, `corral rollout`) show them in `--help`
without loading pydantic."""

from __future__ import annotations

MAX_ERROR_RATIO = 0.05
MAX_TTFT_RATIO = 2.0
TTFT_SLACK_MS = 50.0
MIN_REQUESTS = 20
