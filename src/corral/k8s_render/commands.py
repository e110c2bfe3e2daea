"""The command lines the rendered pods run: the supervisor wrapping the vLLM engine, the preStop drain,
and the router with Kubernetes discovery. Every timing flag comes from `Budgets`, every name from the
config, and no secret value appears: the management token is only ever a file path.
"""

from __future__ import annotations

from corral.k8s_render.budgets import Budgets
from corral.k8s_render.config import CorralDeployment

TOKEN_DIR = "/etc/corral/token"
STATE_DIR = "/var/lib/corral"
DEPLOYMENT_LABEL = "corral.dev/deployment"
ROLE_LABEL = "corral.dev/role"


def _num(value: float) -> str:
    return f"{value:g}"


def token_file(config: CorralDeployment) -> str:
    return f"{TOKEN_DIR}/{config.token.key}"


def engine_selector(config: CorralDeployment) -> dict[str, str]:
    """The labels that select this deployment's engine pods (Deployment, Service, PDB and the router)."""
    return {DEPLOYMENT_LABEL: config.name, ROLE_LABEL: "engine"}


def router_selector(config: CorralDeployment) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: config.name, ROLE_LABEL: "router"}


def engine_argv(config: CorralDeployment) -> list[str]:
    """vLLM's OpenAI server on every interface (the router reaches it by pod IP) and the engine port."""
    e = config.engine
    if e.launcher == "vllm-serve":
        head = ["vllm", "serve", config.model.path]
    else:
        head = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", config.model.path]
    return [
        *head,
        "--host",
        "0.0.0.0",
        "--port",
        str(e.port),
        "--served-model-name",
        config.model.served_name,
        "--tensor-parallel-size",
        str(e.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(e.pipeline_parallel_size),
        *e.args,
    ]


def supervisor_argv(config: CorralDeployment, budgets: Budgets) -> list[str]:
    """`corral supervise run … -- ENGINE`: the container's entrypoint, with the gates and every deadline."""
    gates = [arg for spec in config.dependencies.wait_for for arg in ("--wait-for", spec)]
    return [
        "corral",
        "supervise",
        "run",
        "--host",
        "0.0.0.0",
        "--port",
        str(config.supervisor.port),
        "--engine-url",
        f"http://127.0.0.1:{config.engine.port}",
        "--model",
        config.model.served_name,
        *gates,
        "--dependency-timeout",
        _num(budgets.dependency_timeout),
        "--startup-timeout",
        str(budgets.startup_timeout),
        "--startup-restarts",
        str(budgets.startup_restarts),
        "--restart-backoff",
        _num(budgets.restart_backoff),
        "--stall-seconds",
        _num(config.supervisor.stall_seconds),
        "--drain-policy",
        config.drain.policy,
        "--propagation-timeout",
        _num(budgets.propagation_timeout),
        "--quiet-period",
        _num(budgets.quiet_period),
        "--drain-timeout",
        _num(budgets.drain_timeout),
        "--shutdown-timeout",
        _num(budgets.shutdown_timeout),
        "--state-dir",
        STATE_DIR,
        "--token-file",
        token_file(config),
        "--",
        *engine_argv(config),
    ]


def prestop_argv(config: CorralDeployment, budgets: Budgets) -> list[str]:
    """The preStop hook: drain through the supervisor and block until the engine has stopped."""
    return [
        "corral",
        "supervise",
        "prestop",
        "--url",
        f"http://127.0.0.1:{config.supervisor.port}",
        "--token-file",
        token_file(config),
        "--timeout",
        str(budgets.prestop_timeout),
    ]


def selector_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def router_argv(config: CorralDeployment, budgets: Budgets) -> list[str]:
    """`corral router --discovery k8s` over exactly the pods `engine_selector` matches, following each
    pod's supervisor state stream (and acknowledging removals to it) with the management token."""
    return [
        "corral",
        "router",
        "--host",
        "0.0.0.0",
        "--port",
        str(config.router.port),
        "--discovery",
        "k8s",
        "--namespace",
        config.namespace,
        "--selector",
        selector_text(engine_selector(config)),
        "--engine-port",
        str(config.engine.port),
        "--supervisor-port",
        str(config.supervisor.port),
        "--supervisor-token-file",
        token_file(config),
        "--policy",
        config.router.policy,
        "--request-timeout",
        _num(budgets.router_request_timeout),
        "--shutdown-timeout",
        _num(budgets.router_shutdown_timeout),
    ]
