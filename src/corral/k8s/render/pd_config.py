"""The `pd` section of a `corral.yaml`: a prefill/decode fleet, each role with its own engines, GPUs,
disruption budget and flags, and the KV connector both roles run (vLLM's `--kv-transfer-config`).
Rendering it is `pd_objects.py`; the rules that span it and the rest of the config are `pd_checks`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")

# vLLM's NIXL handshake listener: VLLM_NIXL_SIDE_CHANNEL_PORT (+ the data-parallel index, 0 here) on
# VLLM_NIXL_SIDE_CHANNEL_HOST, which defaults to localhost, where no other pod can reach it.
NIXL_CONNECTOR = "NixlConnector"
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
DEFAULT_SIDE_CHANNEL_PORT = 5600
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
# kv_role each engine role may run: a prefill engine produces KV, a decode engine consumes it
_ROLE_KV: dict[Role, tuple[str, ...]] = {
    "prefill": ("kv_producer", "kv_both"),
    "decode": ("kv_consumer", "kv_both"),
}
# the renderer writes these for each role; a copy in the args would give a pod two connectors
PD_OWNED_FLAGS = ("--kv-transfer-config", "--kv-connector")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PdRoleSpec(_Section):
    """One role's engines: they share the deployment's model, image and engine section, plus these."""

    replicas: int = Field(ge=1, description="engines of this role")
    gpu_capacity: int = Field(
        ge=1,
        description="GPUs this role may use (its node pool): replicas × GPUs per engine must fit, and "
        "what is left over is this role's surge room in a rollout",
    )
    max_unavailable: int = Field(
        default=1,
        ge=1,
        description="engines of this role the service may lose at once: this role's PodDisruptionBudget, "
        "and its rolling update's maxUnavailable when no spare GPUs allow a surge",
    )
    max_surge: int | None = Field(
        default=None, ge=0, description="cap on extra engines of this role during a rollout"
    )
    args: list[str] = Field(
        default_factory=list,
        description="vLLM flags for this role only, after engine.args (e.g. --max-num-batched-tokens)",
    )
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = Field(
        default=None,
        description="this role's kv_role in the connector config; null keeps pd.kv_transfer_config's",
    )
    cpu: str | None = Field(default=None, description="CPU request and limit; null: engine.cpu")
    memory: str | None = Field(default=None, description="memory request and limit; null: engine.memory")
    node_selector: dict[str, str] | None = Field(
        default=None, description="node labels this role's pods need; null: engine.node_selector"
    )

    @field_validator("args")
    @classmethod
    def _no_connector_flags(cls, args: list[str]) -> list[str]:
        return _without_connector_flags(args)


class PdSpec(_Section):
    """Prefill and decode engines of one model. The router pairs a prefill engine with a compatible
    decode engine; both run the connector given here, so it is in each bundle's fingerprint."""

    kv_transfer_config: dict[str, Any] = Field(
        description="vLLM's --kv-transfer-config as a mapping, e.g. {kv_connector: NixlConnector, "
        "kv_role: kv_both}; rendered as compact JSON with sorted keys, so one config always makes "
        "one fingerprint"
    )
    side_channel_port: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=DEFAULT_SIDE_CHANNEL_PORT,
        description="NIXL's handshake port (VLLM_NIXL_SIDE_CHANNEL_PORT) on the pod IP: the "
        "NetworkPolicy opens it between this fleet's engine pods only",
    )
    prefill: PdRoleSpec = Field(description="the prefill engines")
    decode: PdRoleSpec = Field(description="the decode engines")

    @field_validator("kv_transfer_config")
    @classmethod
    def _connector_config(cls, kv: dict[str, Any]) -> dict[str, Any]:
        connector = kv.get("kv_connector")
        if connector != NIXL_CONNECTOR:
            raise ValueError(
                f"kv_connector is {connector!r}; the renderer knows {NIXL_CONNECTOR}'s wire (its side "
                "channel is the port the NetworkPolicy opens between engine pods): set kv_connector: "
                f"{NIXL_CONNECTOR}"
            )
        kv_role = kv.get("kv_role", "kv_both")
        if kv_role not in KV_ROLES:
            raise ValueError(f"kv_role {kv_role!r} is not one of {', '.join(KV_ROLES)}")
        return kv

    @model_validator(mode="after")
    def _roles_can_transfer(self) -> PdSpec:
        problems = [p for p in (self.kv_role_problem(r) for r in ROLES) if p is not None]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def role(self, name: Role) -> PdRoleSpec:
        return self.prefill if name == "prefill" else self.decode

    def role_kv_config(self, name: Role) -> dict[str, Any]:
        """The connector config one role's engines run: the shared one with the role's kv_role."""
        kv = dict(self.kv_transfer_config)
        kv.setdefault("kv_role", "kv_both")
        override = self.role(name).kv_role
        if override is not None:
            kv["kv_role"] = override
        return kv

    def kv_transfer_flag(self, name: Role) -> list[str]:
        """`--kv-transfer-config JSON` as the role's engine command carries it (and the fingerprint)."""
        text = json.dumps(self.role_kv_config(name), sort_keys=True, separators=(",", ":"))
        return ["--kv-transfer-config", text]

    def kv_role_problem(self, name: Role) -> str | None:
        """Why one role's kv_role cannot do its part of a transfer, or None."""
        kv_role = self.role_kv_config(name)["kv_role"]
        if kv_role in _ROLE_KV[name]:
            return None
        return (
            f"a {name} engine with kv_role {kv_role} cannot "
            f"{'send' if name == 'prefill' else 'receive'} KV; use one of {', '.join(_ROLE_KV[name])}"
        )


def _without_connector_flags(args: list[str]) -> list[str]:
    for arg in args:
        if arg.split("=", 1)[0] in PD_OWNED_FLAGS:
            raise ValueError(
                f"{arg!r} is set by the renderer from pd.kv_transfer_config (and each role's kv_role); "
                "remove it from args"
            )
    return args
