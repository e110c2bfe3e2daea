"""The command lines the rendered pods run: the init container deriving the pod's supervisor token,
the supervisor wrapping the vLLM engine (on loopback, behind the supervisor's admission gate), the
preStop drain, and the router with Kubernetes discovery. Every timing flag comes from `Budgets`, every
name from the config, and no secret value appears: the fleet key and the tokens are only file paths.
"""

from __future__ import annotations

from corral.k8s.render.budgets import Budgets
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.kv_events_plan import any_on
from corral.k8s.render.preload_config import engine_loader_args, supervisor_preload_args
from corral.pod_labels import DEPLOYMENT_LABEL, ROLE_LABEL
from corral.supervisor_defaults import DEFAULT_UNANSWERED_SECONDS

KEY_DIR = "/etc/corral/fleet-key"  # the fleet key Secret: the init container and the router only
ADMIN_KEY_DIR = "/etc/corral/router-admin"  # the router's admin key Secret: the router only
ENGINE_API_KEY_DIR = "/etc/corral/engine-api-key"  # the engines' vLLM API key: the router's copy
TENANT_KEYS_DIR = "/etc/corral/router-tenants"  # the router's API keys file (its tenants): the router only
# memory-backed emptyDir: this pod's token, written by the init container. Not under /run: images
# often make /var/run a link to /run, and a volume mounted at /var/run would hide it.
POD_TOKEN_DIR = "/etc/corral/pod-token"
POD_TOKEN_FILE = f"{POD_TOKEN_DIR}/token"
STATE_DIR = "/var/lib/corral"
BUNDLES_DIR = "/etc/corral/bundles"  # the declared bundles (supervisor.rollback_bundle), from a ConfigMap
ENGINE_HOST = "127.0.0.1"
COMPONENT_LABEL = "app.kubernetes.io/component"


def _num(value: float) -> str:
    return f"{value:g}"


def key_file(config: CorralDeployment) -> str:
    return f"{KEY_DIR}/{config.token.key}"


def admin_key_file(config: CorralDeployment) -> str:
    return f"{ADMIN_KEY_DIR}/{config.router.admin_key.key}"


def engine_api_key_file(config: CorralDeployment) -> str | None:
    ref = config.engine_api_key
    return None if ref is None else f"{ENGINE_API_KEY_DIR}/{ref.key}"


def tenant_keys_file(config: CorralDeployment) -> str | None:
    spec = config.router.tenant_keys
    return None if spec is None else f"{TENANT_KEYS_DIR}/{spec.key}"


def bundle_file_name(config: CorralDeployment) -> str | None:
    bundle = config.supervisor.rollback_bundle
    return None if bundle is None else f"{bundle.name}.yaml"


def startup_failure_args(config: CorralDeployment) -> list[str]:
    """--bundle for the declared rollback bundle, and --on-startup-failure unless it is the default."""
    s = config.supervisor
    args = [] if s.rollback_bundle is None else ["--bundle", f"{BUNDLES_DIR}/{bundle_file_name(config)}"]
    if s.on_startup_failure == "rollback":
        assert s.rollback_bundle is not None  # config_reading.cross_check
        args += ["--on-startup-failure", f"rollback={s.rollback_bundle.name}"]
    elif s.on_startup_failure != "restart":
        args += ["--on-startup-failure", s.on_startup_failure]
    return args


def unanswered_args(config: CorralDeployment) -> list[str]:
    """--unanswered-seconds unless it is the supervisor's default (rendered commands stay as they were)."""
    seconds = config.supervisor.unanswered_seconds
    return [] if seconds == DEFAULT_UNANSWERED_SECONDS else ["--unanswered-seconds", _num(seconds)]


def precheck_args(config: CorralDeployment) -> list[str]:
    """--allow-floating-revision and --expect-fingerprint, when the config asks for them."""
    args = ["--allow-floating-revision"] if config.model.allow_floating_revision else []
    fingerprint = config.supervisor.expect_fingerprint
    return args + (["--expect-fingerprint", fingerprint] if fingerprint is not None else [])


RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def lora_args(config: CorralDeployment) -> list[str]:
    """The supervisor's --lora NAME=PATH for each adapter of engine.lora."""
    return [arg for a in config.engine.lora for arg in ("--lora", f"{a.name}={a.path}")]


def engine_selector(config: CorralDeployment) -> dict[str, str]:
    """The labels that select this deployment's engine pods (Deployment, Service, PDB and the router).
    A P/D fleet's engine pods carry their role (`corral.dev/role=prefill|decode`, which the router's
    pod source reads), so all of them are selected by their component instead."""
    if config.pd is not None:
        return {DEPLOYMENT_LABEL: config.name, COMPONENT_LABEL: "engine"}
    return {DEPLOYMENT_LABEL: config.name, ROLE_LABEL: "engine"}


def role_selector(config: CorralDeployment, role: str) -> dict[str, str]:
    """The labels of one role's engine pods in a P/D fleet (its Deployment and PDB)."""
    return {DEPLOYMENT_LABEL: config.name, ROLE_LABEL: role}


def router_selector(config: CorralDeployment) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: config.name, ROLE_LABEL: "router"}


def engine_argv(config: CorralDeployment) -> list[str]:
    """vLLM's OpenAI server on loopback only: the pod network reaches it through the admission gate,
    never its development endpoints (/collective_rpc, /sleep... under VLLM_SERVER_DEV_MODE=1)."""
    e = config.engine
    if e.launcher == "vllm-serve":
        head = ["vllm", "serve", config.model.path]
    else:
        head = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", config.model.path]
    revision = [] if config.model.revision is None else ["--revision", config.model.revision]
    return [
        *head,
        *revision,
        "--host",
        ENGINE_HOST,
        "--port",
        str(e.port),
        "--served-model-name",
        config.model.served_name,
        "--tensor-parallel-size",
        str(e.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(e.pipeline_parallel_size),
        *e.args,
        *(["--enable-lora"] if e.lora and "--enable-lora" not in e.args else []),
        *engine_loader_args(config.preload),
    ]


def preload_args(config: CorralDeployment) -> list[str]:
    """--preload-command and --preload-health when `preload.enabled` (k8s/render/preload_config)."""
    e = config.engine
    return supervisor_preload_args(
        config.preload, config.model.path, config.model.revision, e.tensor_parallel_size, e.args
    )


def supervisor_argv(config: CorralDeployment, budgets: Budgets, extra: tuple[str, ...] = ()) -> list[str]:
    """`corral supervise run … -- ENGINE`: the container's entrypoint, with the gates and every deadline
    (and `extra`, e.g. a P/D engine's --role)."""
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
        f"http://{ENGINE_HOST}:{config.engine.port}",
        "--gate-port",
        str(config.supervisor.gate_port),
        "--gate-host",
        "0.0.0.0",
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
        *unanswered_args(config),
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
        POD_TOKEN_FILE,
        *startup_failure_args(config),
        *precheck_args(config),
        *lora_args(config),
        *preload_args(config),
        *extra,
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
        POD_TOKEN_FILE,
        "--timeout",
        str(budgets.prestop_timeout),
    ]


def derive_token_argv(config: CorralDeployment) -> list[str]:
    """The init container: this pod's supervisor token from the fleet key and the pod's own name
    (`$(POD_NAMESPACE)`, `$(POD_NAME)`: the downward API, expanded by the kubelet)."""
    return [
        "corral",
        "supervise",
        "derive-token",
        "--key-file",
        key_file(config),
        "--namespace",
        "$(POD_NAMESPACE)",
        "--pod-name",
        "$(POD_NAME)",
        "--out",
        POD_TOKEN_FILE,
    ]


def selector_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def router_tokenizer(config: CorralDeployment) -> str | None:
    """The router's --tokenizer: router.tokenizer, when some engine group publishes KV events for it to
    read (kv_events_plan); without one the router keeps no KV index."""
    return config.router.tokenizer if any_on(config) else None


# How long the router holds a pod that joins (a scale-up, a replaced pod) out of routing while it
# loads, through that pod's supervisor, the LoRA adapters the other pods were given at run time
# (`corral lora load`): one adapter load's budget (fleet/local/adapters.LOAD_SECONDS); then the pod is
# routed with what it has, the failure in /v1/fleet (router/discovery/adapter_carry.py).
CARRY_ADAPTERS_SECONDS = 120


def _core_args(config: CorralDeployment) -> list[str]:
    """What the router and the endpoint picker both follow, and how: exactly the pods `engine_selector`
    matches, each pod's admission gate for the data path and its supervisor state stream (acknowledging
    removals to it) with that pod's token, derived from the fleet key; the admin key for /metrics and
    /v1/fleet; the tenants' and the engines' keys; the policy (corral.router.core_options)."""
    engine_key = engine_api_key_file(config)
    tenants = tenant_keys_file(config)
    tokenizer = router_tokenizer(config)
    return [
        "--discovery",
        "k8s",
        "--namespace",
        config.namespace,
        "--selector",
        selector_text(engine_selector(config)),
        "--engine-port",
        str(config.supervisor.gate_port),
        "--supervisor-port",
        str(config.supervisor.port),
        "--supervisor-token-key-file",
        key_file(config),
        "--carry-adapters-seconds",
        str(CARRY_ADAPTERS_SECONDS),
        "--admin-key-file",
        admin_key_file(config),
        *(["--api-keys-file", tenants] if tenants is not None else []),
        *(["--engine-api-key-file", engine_key] if engine_key is not None else []),
        "--policy",
        config.router.policy,
        *(
            ["--slow-start-seconds", _num(config.router.slow_start_seconds)]
            if config.router.slow_start_seconds
            else []
        ),
        *(["--tokenizer", tokenizer] if tokenizer is not None else []),
    ]


def router_argv(config: CorralDeployment, budgets: Budgets) -> list[str]:
    """`corral router --discovery k8s` (`_core_args`). It listens on the pod network, so its admin routes
    (/metrics, /v1/fleet) answer only a request bearing the admin key, and its OpenAI paths, with
    router.tenant_keys, only a tenant's key; when the engines enforce vLLM's API key, the router's probes
    and requests carry it (config_reading refuses that without tenant keys)."""
    return [
        "corral",
        "router",
        "--host",
        "0.0.0.0",
        "--port",
        str(config.router.port),
        *_core_args(config),
        "--request-timeout",
        _num(budgets.router_request_timeout),
        "--shutdown-timeout",
        _num(budgets.router_shutdown_timeout),
        # with router.cpu the pod's CPU limit sets the workers (the router's default reads the cgroup);
        # without a limit the node's CPU count would, so one process
        *(["--workers", "1"] if config.router.cpu is None else []),
    ]


def epp_selector(config: CorralDeployment) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: config.name, ROLE_LABEL: "epp"}


def epp_argv(config: CorralDeployment, budgets: Budgets) -> list[str]:
    """`corral epp` over the same pods, following the same supervisors as the router does
    (`_core_args`): the gateway's ext_proc on the pod network, probes and /metrics on its HTTP port."""
    gateway = config.gateway
    assert gateway is not None
    return [
        "corral",
        "epp",
        "--grpc-host",
        "0.0.0.0",
        "--grpc-port",
        str(gateway.grpc_port),
        "--host",
        "0.0.0.0",
        "--port",
        str(gateway.http_port),
        "--fallbacks",
        str(gateway.fallbacks),
        *_core_args(config),
        "--shutdown-timeout",
        _num(budgets.router_shutdown_timeout),
    ]
