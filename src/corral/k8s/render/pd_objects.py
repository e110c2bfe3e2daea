"""The engine objects of a prefill/decode fleet: one Deployment and one PodDisruptionBudget per role
(label `corral.dev/role=prefill|decode`, surge and unavailability from that role's spare GPUs), each
engine running the role's `--kv-transfer-config` (so the connector is in its bundle fingerprint) with
NIXL's side channel on the pod IP, open in the NetworkPolicy to this fleet's engine pods only.
"""

from __future__ import annotations

from dataclasses import replace

from corral.k8s.render import commands
from corral.k8s.render.budgets import Budgets, Step, derive
from corral.k8s.render.config import CorralDeployment, RolloutSpec
from corral.k8s.render.engine_objects import engine_deployment, engine_network_policy
from corral.k8s.render.kv_events_plan import decide
from corral.k8s.render.parts import Obj, disruption_budget
from corral.k8s.render.pd_config import (
    ROLES,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT_ENV,
    PdSpec,
    Role,
)

SIDE_CHANNEL_PORT_NAME = "kv-side-channel"  # a container port name: at most 15 characters
_ROLLOUT_STEPS = ("maxSurge", "maxUnavailable")


def _pd(config: CorralDeployment) -> PdSpec:
    if config.pd is None:
        raise ValueError(f"{config.name} declares no pd section")
    return config.pd


def role_name(config: CorralDeployment, role: Role) -> str:
    return f"{config.name}-{role}"


def role_config(config: CorralDeployment, role: Role) -> CorralDeployment:
    """The deployment as one role's engines see it: the role's replicas, GPUs, rollout budget,
    resources and flags, and the connector config with the role's kv_role as the last flag."""
    pd = _pd(config)
    spec = pd.role(role)
    e = config.engine
    engine = e.model_copy(
        update={
            "args": [*e.args, *spec.args, *pd.kv_transfer_flag(role)],
            "env": {**e.env, SIDE_CHANNEL_PORT_ENV: str(pd.side_channel_port)},
            "cpu": spec.cpu if spec.cpu is not None else e.cpu,
            "memory": spec.memory if spec.memory is not None else e.memory,
            "node_selector": spec.node_selector if spec.node_selector is not None else e.node_selector,
        }
    )
    return config.model_copy(
        update={
            "replicas": spec.replicas,
            "gpu": config.gpu.model_copy(update={"capacity": spec.gpu_capacity}),
            "engine": engine,
            "rollout": RolloutSpec(max_unavailable=spec.max_unavailable, max_surge=spec.max_surge),
        }
    )


def role_budgets(config: CorralDeployment) -> dict[Role, Budgets]:
    """Each role's numbers: the same load and drain deadlines, its own surge, unavailability and PDB."""
    return {role: derive(role_config(config, role)) for role in ROLES}


def explain(config: CorralDeployment, budgets: Budgets) -> tuple[tuple[Step, ...], tuple[str, ...]]:
    """The steps and warnings of a P/D fleet: the shared deadlines once, then each role's rollout
    arithmetic (its spare GPUs, surge, unavailability and PDB) under the role's name."""
    steps = [s for s in budgets.steps if s.name not in _ROLLOUT_STEPS]
    warnings: list[str] = []
    for role, b in role_budgets(config).items():
        steps += [
            replace(s, name=f"{role} {s.name}", formula=s.formula.replace("rollout.", f"pd.{role}."))
            for s in b.steps
            if s.name in _ROLLOUT_STEPS
        ]
        steps.append(
            Step(
                f"{role} PDB maxUnavailable",
                b.pdb_max_unavailable,
                f"pd.{role}.max_unavailable (of {role_config(config, role).replicas} engines)",
            )
        )
        warnings += [f"pd.{role}: {w}" for w in b.warnings]
    return tuple(steps), tuple(warnings)


def _side_channel_env() -> tuple[Obj, ...]:
    # vLLM's NIXL handshake listens on VLLM_NIXL_SIDE_CHANNEL_HOST, localhost unless told: the pod IP
    return ({"name": SIDE_CHANNEL_HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},)


def role_deployment(config: CorralDeployment, role: Role, budgets: Budgets) -> Obj:
    pd = _pd(config)
    return engine_deployment(
        role_config(config, role),
        budgets,
        name=role_name(config, role),
        selector=commands.role_selector(config, role),
        extra_env=_side_channel_env(),
        extra_ports=(
            {"name": SIDE_CHANNEL_PORT_NAME, "containerPort": pd.side_channel_port, "protocol": "TCP"},
        ),
        # the supervisor publishes the role to routers, and its word wins over the pod label; under
        # kv_both (NIXL's usual kv_role for either side) it could not tell the role from the command
        supervisor_args=("--role", role),
        kv_events=decide(config, role),
    )


def role_pdb(config: CorralDeployment, role: Role, budgets: Budgets) -> Obj:
    return disruption_budget(
        config,
        role_name(config, role),
        commands.role_selector(config, role),
        "engine",
        budgets.pdb_max_unavailable,
    )


def pd_network_policy(config: CorralDeployment) -> Obj:
    """The engine NetworkPolicy plus NIXL's side channel, from this fleet's engine pods only: a decode
    engine reaches the prefill engine named in kv_transfer_params (remote_host, remote_port)."""
    policy = engine_network_policy(config)
    engines = commands.engine_selector(config)
    policy["spec"]["ingress"].append(
        {
            "from": [{"podSelector": {"matchLabels": engines}}],
            "ports": [{"port": _pd(config).side_channel_port, "protocol": "TCP"}],
        }
    )
    return policy


def pd_engine_objects(config: CorralDeployment) -> list[tuple[str, Obj]]:
    """(file name, object) of each role's Deployment and PodDisruptionBudget."""
    objects: list[tuple[str, Obj]] = []
    for role, budgets in role_budgets(config).items():
        objects.append((f"{role}-deployment.yaml", role_deployment(config, role, budgets)))
        objects.append((f"{role}-pdb.yaml", role_pdb(config, role, budgets)))
    return objects
