"""The `autoscaling` section of corral.yaml: an HPA (autoscaling/v2, an External metric through a
Prometheus adapter) or a KEDA ScaledObject (a Prometheus trigger) on the router's
`corral_router_model_desired_replicas` (docs/scaling.md). Off by default: both need something in the
cluster (the adapter or KEDA) and the router's ServiceMonitor feeding Prometheus."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_REPLICAS = 1000


class AutoscalingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="render an autoscaler for the engine Deployment")
    scaler: Literal["hpa", "keda"] = Field(
        default="hpa",
        description="hpa: a HorizontalPodAutoscaler on an External metric served by a Prometheus adapter "
        "(docs/scaling.md has its rule); keda: a KEDA ScaledObject with a Prometheus trigger",
    )
    min_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS, description="engines at least")
    max_replicas: int = Field(default=4, ge=1, le=MAX_REPLICAS, description="engines at most")
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="the highest recommendation over this window is used when scaling down (and KEDA's "
        "cooldown)",
    )
    prometheus_address: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s?#]+$",
        max_length=2048,
        description="keda: the Prometheus the trigger queries, e.g. http://prometheus-operated.monitoring:9090",
    )
    polling_interval_seconds: int = Field(default=15, ge=1, le=3600, description="keda: how often it asks")

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} is below min_replicas {self.min_replicas}")
        if self.enabled and self.scaler == "keda" and self.prometheus_address is None:
            raise ValueError("scaler keda needs prometheus_address: the Prometheus its trigger queries")
        return self
