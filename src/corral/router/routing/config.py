"""The `--policy-config` file (YAML or JSON): the policy for each model, named scored policies with
their weights, and the knobs of prefix hashing and metrics scraping.

    policy: prefix                # for models not listed (default: the --policy flag)
    eps: 1.0                      # load bound: no engine above ceil((1 + eps) * mean) in flight
    block_chars: 128              # prefix key: whole blocks of this many prompt characters ...
    key_blocks: 4                 # ... at most this many of them
    scrape_interval: 1.0          # at least this many seconds between /metrics scrapes of one engine
    scrape_budget: 50             # /metrics scrapes per second for the whole fleet, spread evenly
    stale_after: 5.0              # older metrics count as saturated (default: 5 scrape periods, >= 0.5 s)
    header: x-corral-policy       # a request may name its policy in this header
    prefix_placement: cost        # the built-in prefix policy: headroom (default), cost or ring
    slow_start_seconds: 30        # ramp of an endpoint that becomes routable (default: --slow-start-seconds)
    slow_start_models:            # per model; 0 turns slow start off for it
      llama-8b-sql: 0
    policies:                     # scored policies besides the built-in ones
      cache-first: {weights: {prefix: 1.0, queue: 0.1}, eps: 0.5}
      prefix-ring: {weights: {prefix: 1.0, queue: 0.2}, placement: ring}  # the placement before issue 17
      prefix-affinity:            # the placement of issues 17-27: a holder within the load bound always wins
        weights: {prefix: 1.0, queue: 0.15, recent: 0.15, in_flight: 0.1, kv_usage: 0.05}
        placement: headroom
    models:
      llama-8b: cache-first
      llama-8b-sql: prefix
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.policy_names import POLICY_NAMES
from corral.router.routing.scorers import SCORER_NAMES


class PolicyConfigError(ValueError):
    pass


class ScoredPolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float]
    eps: float | None = Field(default=None, ge=0)
    # cost: each prompt where its first token is expected soonest (its queue's prefill plus what the
    # cached prefix does not save; issue 28); headroom: new prefixes to the endpoint with the most
    # headroom, a holder within the load bound always (issue 17); ring: new prefixes to their
    # consistent-hash home, spills along the ring (before issue 17)
    placement: Literal["cost", "headroom", "ring"] = "headroom"

    @field_validator("weights")
    @classmethod
    def _known_scorers(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(weights) - set(SCORER_NAMES))
        if unknown:
            raise ValueError(f"unknown scorer(s) {unknown}; choose among {', '.join(SCORER_NAMES)}")
        if any(w < 0 for w in weights.values()):
            raise ValueError("weights must be >= 0")
        return weights


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str | None = None
    # At a few requests in flight the bound is coarse (ceil((1 + 0.25) * 2 / 4) = 1: a home with one
    # request open already spills), and each spill is a full prefill elsewhere. benchmarks/bench_prefix.py:
    # eps 0.25 -> hit rate 0.74, TTFT p90 305 ms; eps 1.0 -> 0.84, 43 ms (RESULTS.md).
    eps: float = Field(default=1.0, ge=0)
    block_chars: int = Field(default=128, ge=1)
    key_blocks: int = Field(default=4, ge=1)
    # Once a second per engine at most; past scrape_budget * scrape_interval engines, less often
    # (load_scraper.LoadScraper.period_for): the router's in-flight counts are the live signal.
    scrape_interval: float = Field(default=1.0, ge=0.02)
    scrape_budget: float = Field(default=50.0, gt=0)
    stale_after: float | None = Field(default=None, gt=0)
    header: str = "x-corral-policy"
    # The built-in `prefix` policy's placement. headroom (issue 17) until cost (issue 28) has a price for
    # what a copy evicts: on single runs cost beat it under bursts (p90 0.40x vs 0.44x the oracle's) and
    # lost on the agentic preset (1.25-1.35x vs 1.00x) and the Mooncake replay (1.05x vs 0.90x the
    # reference); benchmarks/RESULTS.md.
    prefix_placement: Literal["cost", "headroom", "ring"] = "headroom"
    slow_start_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    slow_start_models: dict[str, float] = Field(default_factory=dict)
    policies: dict[str, ScoredPolicySpec] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=dict)

    @field_validator("slow_start_models")
    @classmethod
    def _ramps(cls, ramps: dict[str, float]) -> dict[str, float]:
        bad = {model: s for model, s in ramps.items() if not 0 <= s < float("inf")}
        if bad:
            raise ValueError(f"seconds must be >= 0 (0 turns slow start off), got {bad}")
        return ramps

    def stale_seconds(self) -> float:
        """Staleness before the scraper sets it from the fleet's size (when `stale_after` is not fixed)."""
        return self.stale_after if self.stale_after is not None else max(5 * self.scrape_interval, 0.5)


def check_policy_names(config: RoutingConfig, builtins: Iterable[str], source: str) -> None:
    """Every policy the config routes by must exist: built in or defined under `policies:`."""
    known = {*builtins, *config.policies}
    named = [config.policy] if config.policy else []
    for name in [*named, *config.models.values()]:
        if name not in known:
            raise PolicyConfigError(
                f"{source}: policy {name!r} is neither built in nor under `policies:`; "
                f"known: {', '.join(sorted(known))}"
            )


def load_routing_config(path: Path) -> RoutingConfig:
    """Read and check the file; every problem is a `PolicyConfigError` naming the file and the field."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyConfigError(
            f"--policy-config {str(path)!r} is unreadable: {exc.strerror or exc}"
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyConfigError(f"--policy-config {str(path)!r} is not YAML or JSON: {exc}") from None
    try:
        config = RoutingConfig.model_validate(raw or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
        )
        raise PolicyConfigError(f"--policy-config {str(path)!r}: {problems}") from None
    check_policy_names(config, POLICY_NAMES, f"--policy-config {str(path)!r}")
    return config
