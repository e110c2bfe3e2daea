"""The `kv_events` section of corral.yaml: whether `corral k8s render` has the engines publish their
KV-cache events to the routers (vLLM's `--kv-events-config`, a ZMQ publisher and replay socket on the
pod IP, open in the NetworkPolicy to the router pods only), and on which ports. On by default; where an
engine group cannot publish or the router cannot read them, render says why (`kv_events_plan.py`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Port = Annotated[int, Field(ge=1, le=65535)]

DEFAULT_PORT = 5557  # vLLM's own default publisher port (KVEventsConfig.endpoint tcp://*:5557)
DEFAULT_REPLAY_PORT = 5558


class KvEventsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="the engines publish their KV-cache events (--kv-events-config) and the routers "
        "follow them to route by the prefixes each engine holds, wherever the config allows it "
        "(`corral k8s render` prints, per engine group, whether they are on and why); false renders none",
    )
    port: Port = Field(
        default=DEFAULT_PORT,
        description="the engines' event publisher port on the pod IP (container port kv-events); the "
        "events carry prompt tokens, so the NetworkPolicy opens it to the router pods only",
    )
    replay_port: Port = Field(
        default=DEFAULT_REPLAY_PORT,
        description="the engines' replay socket port (container port kv-replay), from which a router "
        "that connects late or misses a batch catches up; open to the router pods only",
    )
