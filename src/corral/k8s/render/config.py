"""The `corral.yaml` of `corral k8s render`: one pydantic model of a deployment (model, engine, GPUs,
dependencies, load-time and drain inputs, router, security). Reading it from YAML and the checks
that span fields are in `config_reading.py`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.gate_spec import GateSpecError, parse_gate_spec
from corral.k8s.render.autoscaling_config import AutoscalingSpec
from corral.k8s.render.images_config import ImagesSpec, fill_default_images
from corral.k8s.render.kv_events_config import KvEventsSpec
from corral.k8s.render.monitoring_config import MonitoringSpec
from corral.k8s.render.pd_config import PdSpec
from corral.k8s.render.preload_config import PreloadSpec
from corral.k8s.render.preload_config import problems as preload_problems
from corral.policy_names import POLICY_NAMES
from corral.redaction import is_secret_name, redact_argv
from corral.supervisor_defaults import DEFAULT_UNANSWERED_SECONDS

# Object names get suffixes up to "-router-pods" (12) and Service names must be DNS-1035 labels (63).
_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_NAME_MAX = 63 - len("-router-pods")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Engine flags the renderer sets from other fields; a second copy in engine.args would silently win or lose.
_OWNED_FLAGS: dict[str, str] = {
    "--host": "the engine listens on 127.0.0.1, behind the supervisor's admission gate "
    "(supervisor.gate_port), so its development endpoints never reach the pod network",
    "--port": "set it with engine.port",
    "--model": "set it with model.path",
    "--served-model-name": "set it with model.served_name",
    "--revision": "set it with model.revision (a 40-hex commit)",
    "--tensor-parallel-size": "set it with engine.tensor_parallel_size (it also sizes the GPU request)",
    "-tp": "set it with engine.tensor_parallel_size (it also sizes the GPU request)",
    "--pipeline-parallel-size": "set it with engine.pipeline_parallel_size (it also sizes the GPU request)",
    "-pp": "set it with engine.pipeline_parallel_size (it also sizes the GPU request)",
    "--api-key": "a key in args is readable by anyone who can read the Deployment; "
    "put it in a Secret and pass it with engine.secret_env (VLLM_API_KEY)",
    "--hf-token": "a token in args is readable by anyone who can read the Deployment; "
    "put it in a Secret and pass it with engine.secret_env (HF_TOKEN)",
}

Seconds = Annotated[float, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=1, le=65535)]


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        name = key.rsplit("/", 1)[-1]
        if not _LABEL_KEY.match(key) or len(name) > 63:
            raise ValueError(f"{key!r} is not a label key (optional prefix/, then up to 63 of [-_.a-z0-9])")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ValueError(f"{key}: {value!r} is not a label value (up to 63 of [-_.A-Za-z0-9])")
    return labels


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Section):
    path: str = Field(
        min_length=1, description="what the engine loads: a directory inside the container or a model id"
    )
    served_name: str = Field(
        min_length=1,
        description="the model name clients send; the supervisor's smoke request and the router use it",
    )
    weights_gib: float = Field(
        gt=0, description="size of the weight files in GiB (e.g. 15 for an 8B model in bf16)"
    )
    revision: str | None = Field(
        default=None,
        pattern=r"^[^\s-]\S*$",
        description="the hub commit to serve (--revision): 40 hex digits; a hub id in path needs it, "
        "or allow_floating_revision",
    )
    allow_floating_revision: bool = Field(
        default=False,
        description="serve a hub id at whatever its branch or tag points to (no revision, or not a "
        "commit): the supervisor's --allow-floating-revision",
    )

    @property
    def is_hub_id(self) -> bool:
        """An absolute path is a directory in the container; anything else vLLM downloads from the hub."""
        return not self.path.startswith("/")


class HostPathVolume(_Section):
    name: str = Field(pattern=_DNS_LABEL, max_length=63, description="a DNS-1123 label, e.g. models")
    host_path: str = Field(pattern=r"^/", description="an absolute path on the node")
    mount_path: str = Field(pattern=r"^/", description="an absolute path in the engine container")
    type: Literal["Directory", "DirectoryOrCreate", "Socket", "File", "FileOrCreate"] = "DirectoryOrCreate"
    read_only: bool = Field(
        default=True,
        description="mounted read-only (the default: a model directory the engine could overwrite is a "
        "node-wide risk); false for a directory the engine must write",
    )


class LoraAdapterSpec(_Section):
    name: str = Field(
        pattern=r"^[^=\s]{1,200}$", description="the model name clients send for this adapter (no '=')"
    )
    path: str = Field(
        pattern=r"^/",
        description="an absolute path: the adapter's directory in the engine container, "
        "under an engine.volumes mount_path",
    )


class SecretRef(_Section):
    secret_name: str = Field(pattern=_DNS_LABEL, description="name of an existing Secret in the namespace")
    key: str = Field(min_length=1, description="the key inside that Secret")


class EngineSpec(_Section):
    launcher: Literal["vllm-serve", "api-server"] = Field(
        default="vllm-serve",
        description="`vllm-serve` runs `vllm serve MODEL`; `api-server` runs "
        "`python3 -m vllm.entrypoints.openai.api_server --model MODEL`",
    )
    port: Port = Field(
        default=8000,
        description="the engine's OpenAI port, on the pod's loopback only; the pod network reaches it "
        "through the supervisor's admission gate (supervisor.gate_port)",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per pipeline stage")
    pipeline_parallel_size: int = Field(default=1, ge=1, description="pipeline stages")
    args: list[str] = Field(
        default_factory=list, description="further vLLM flags, e.g. [--max-model-len, '15000']"
    )
    env: dict[str, str] = Field(default_factory=dict, description="plain environment variables")
    secret_env: dict[str, SecretRef] = Field(
        default_factory=dict, description="environment variables read from Secrets (NAME: {secret_name, key})"
    )
    cpu: str | None = Field(default=None, description="CPU request and limit, e.g. '8'")
    memory: str | None = Field(default=None, description="memory request and limit, e.g. 64Gi")
    shm_size: str | None = Field(default="4Gi", description="size of /dev/shm (memory-backed); null for none")
    volumes: list[HostPathVolume] = Field(default_factory=list, description="hostPath volumes to mount")
    lora: list[LoraAdapterSpec] = Field(
        default_factory=list,
        description="LoRA adapters every engine serves ({name, path}): the supervisor's --lora NAME=PATH, "
        "loaded after every engine start before READY (the engine gets --enable-lora and "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 for it); adapters loaded at run time (`corral lora load`) "
        "are loaded by the router on a pod that joins later, before it routes the pod",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="node labels the pods need")
    serving_group: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$",
        description="the engine pods serve as one group of `replicas` pods (label "
        "corral.dev/serving-group, its size in corral.dev/serving-group-size): the router routes to them "
        "only while every pod is READY on one bundle, and withdraws all of them when one leaves",
    )

    @property
    def gpus(self) -> int:
        """GPUs one engine needs: every rank of every pipeline stage holds one."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @field_validator("args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        for i, arg in enumerate(args):
            flag = arg.split("=", 1)[0]
            if flag in _OWNED_FLAGS:  # the flag, not the argument: `--api-key=KEY` would show the key
                raise ValueError(
                    f"{flag!r} is set by the renderer: {_OWNED_FLAGS[flag]}; remove it from args"
                )
            if redact_argv([arg]) != [arg]:
                raise ValueError(
                    f"[{i}] holds a secret in its JSON (a key such as s3_secret_access_key or a password), "
                    "which anyone who can read the Deployment could read; put it in a Secret and give it "
                    "to the engine with engine.secret_env (e.g. S3_SECRET_ACCESS_KEY, AWS_SECRET_ACCESS_KEY)"
                )
        return args

    @field_validator("lora")
    @classmethod
    def _one_path_per_adapter(cls, adapters: list[LoraAdapterSpec]) -> list[LoraAdapterSpec]:
        names = [a.name for a in adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"adapter {twice[0]!r} is listed twice; give each adapter one path")
        return adapters

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names(cls, env: dict[str, Any]) -> dict[str, Any]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, _)")
        return env

    @field_validator("env")
    @classmethod
    def _no_plain_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if is_secret_name(name) and value:
                raise ValueError(
                    f"{name} looks like a secret and would be stored in the Deployment in plain text; "
                    f"move it to engine.secret_env as {name}: {{secret_name: ..., key: ...}}"
                )
        return env


class GpuSpec(_Section):
    resource: str = Field(default="nvidia.com/gpu", description="the extended resource name of the GPUs")
    capacity: int = Field(
        ge=1,
        description="GPUs this deployment may use in the cluster (or its node pool): replicas × GPUs per "
        "engine must fit, and what is left over is the rolling update's surge room",
    )


class DependencySpec(_Section):
    wait_for: list[str] = Field(
        default_factory=list,
        description="supervisor --wait-for gates: unix:PATH, tcp:HOST:PORT, http(s)://URL, file:PATH",
    )
    timeout_seconds: PositiveSeconds = Field(
        default=600.0, description="the longest a dependency may take to come up (--dependency-timeout)"
    )

    @field_validator("wait_for")
    @classmethod
    def _gates_parse(cls, specs: list[str]) -> list[str]:
        for i, spec in enumerate(specs):
            try:
                parse_gate_spec(spec)
            except GateSpecError as exc:
                raise ValueError(f"[{i}] {exc}") from None
        return specs


class StartupSpec(_Section):
    """What the longest legal load is made of; the startup budget is computed from these."""

    download_gbps: float | None = Field(
        default=None,
        gt=0,
        description="GB/s at which the engine downloads the weights when it starts; null when they are "
        "already on a local disk or volume",
    )
    read_gbps: float = Field(gt=0, description="GB/s at which the weights are read from disk into memory")
    process_start_seconds: Seconds = Field(
        default=60.0, description="engine process start: imports, device init, tokenizer, KV profiling"
    )
    quantization_seconds: Seconds = Field(default=0.0, description="online quantization allowance")
    compile_seconds: Seconds = Field(default=0.0, description="torch.compile allowance")
    graph_capture_seconds: Seconds = Field(default=30.0, description="CUDA graph capture allowance")
    warmup_seconds: Seconds = Field(default=30.0, description="warmup after the weights are loaded")
    smoke_seconds: Seconds = Field(default=10.0, description="the supervisor's smoke completion")
    margin: float = Field(
        default=1.5, ge=1.0, description="safety factor on the computed load time (1.5 = 50% headroom)"
    )
    restarts: int = Field(
        default=1,
        ge=0,
        le=10,
        description="in-place engine restarts the supervisor allows during startup (--startup-restarts); "
        "each gets a full load inside the startup budget",
    )
    restart_backoff_seconds: Seconds = Field(
        default=1.0, description="first restart delay; doubles each time, capped at 30 s"
    )


class DrainSpec(_Section):
    policy: Literal["wait", "abort"] = Field(
        default="wait", description="`wait` lets accepted requests finish; `abort` cuts them"
    )
    longest_stream_seconds: PositiveSeconds = Field(
        description="the longest request the service accepts, start to last token: a drain under policy "
        "wait waits this long for in-flight requests (--drain-timeout)"
    )
    propagation_seconds: PositiveSeconds | None = Field(
        default=None,
        description="longest wait for routing to leave the engine (--propagation-timeout); null derives "
        "it from the readiness probe",
    )
    quiet_period_seconds: Seconds = Field(
        default=1.0, description="no request for this long means routing has left (--quiet-period)"
    )
    engine_shutdown_seconds: PositiveSeconds = Field(
        default=30.0, description="SIGTERM to SIGKILL for the engine process (--shutdown-timeout)"
    )


class ProbeSpec(_Section):
    startup_period_seconds: int = Field(default=10, ge=1, description="startupProbe periodSeconds")
    readiness_period_seconds: int = Field(default=2, ge=1, description="readinessProbe periodSeconds")
    readiness_failure_threshold: int = Field(default=1, ge=1, description="readinessProbe failureThreshold")
    liveness_period_seconds: int = Field(default=10, ge=1, description="livenessProbe periodSeconds")
    liveness_failure_threshold: int = Field(default=3, ge=1, description="livenessProbe failureThreshold")
    timeout_seconds: int = Field(default=5, ge=1, description="timeoutSeconds of every probe")


class RolloutSpec(_Section):
    max_unavailable: int = Field(
        default=1,
        ge=1,
        description="engines the service may lose at once: the PodDisruptionBudget, and the rolling "
        "update's maxUnavailable when no spare GPUs allow a surge",
    )
    max_surge: int | None = Field(
        default=None,
        ge=0,
        description="cap on extra engines during a rollout; null: as many as spare GPUs fit",
    )


class AdminKeySpec(_Section):
    """The router's admin key: `/metrics` and `/v1/fleet` answer on the pod network only a request
    bearing it (`Authorization: Bearer KEY`), e.g. Prometheus's scrape."""

    secret_name: str | None = Field(
        default=None,
        pattern=_DNS_LABEL,
        description="Secret holding the router's admin key, mounted in the router pods only; null means "
        "NAME-corral-router-admin",
    )
    key: str = Field(default="key", min_length=1, description="key of the admin key inside the Secret")


class TenantKeysSpec(_Section):
    """The router's tenants: an API keys file (`--api-keys-file`: a YAML list of {name, key_sha256 or
    key, max_in_flight?, requests_per_minute?, models?}) kept in a Secret and mounted in the router pods
    only. The router's OpenAI paths then answer only a request bearing one of its keys."""

    secret_name: str = Field(
        pattern=_DNS_LABEL, description="Secret holding the API keys file, e.g. NAME-router-tenants"
    )
    key: str = Field(
        default="tenants.yaml",
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="key of the API keys file inside the Secret",
    )


class RouterSpec(_Section):
    replicas: int = Field(default=2, ge=1, description="router pods")
    image: str | None = Field(
        default=None, description="router image; null: the Corral router image from images.registry"
    )
    port: Port = Field(default=8000, description="the router's port, in the pod and on its Service")
    policy: str = Field(default="least_request", description=f"one of {', '.join(POLICY_NAMES)}")
    slow_start_seconds: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        strict=True,
        description="the router's --slow-start-seconds: an engine that becomes routable (started, woken, "
        "restarted, a rollout's new group) takes a share of traffic rising from 10% to its full share over "
        "this many seconds, so its first requests do not all meet a cold cache at once. 0 (the default): "
        "off, full share at once; a production fleet sets it (docs/operations.md, production defaults)",
    )
    cpu: str | None = Field(default=None, description="CPU request and limit")
    memory: str | None = Field(default=None, description="memory request and limit")
    admin_key: AdminKeySpec = Field(
        default_factory=AdminKeySpec,
        description="the Secret whose key opens the router's /metrics and /v1/fleet (--admin-key-file)",
    )
    tenant_keys: TenantKeysSpec | None = Field(
        default=None,
        description="the Secret holding the router's API keys file (--api-keys-file); required when the "
        "engines enforce an API key (VLLM_API_KEY in engine.secret_env): the router listens on the pod "
        "network and sends that key with every request it forwards",
    )
    tokenizer: str | None = Field(
        default=None,
        pattern=r"^\S+$",
        description="what the router tokenizes prompts with to read the engines' KV events (its "
        "--tokenizer): the model's tokenizer as the router container holds it (a directory, or a hub id "
        "it downloads into /tmp), in a router image with the `transformers` package, which the Corral "
        "router image does not have; `sim` for `corral sim` engines. null: the router reads no KV "
        "events and routes by its own prefix memory",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, policy: str) -> str:
        if policy not in POLICY_NAMES:
            raise ValueError(f"unknown routing policy; use one of {', '.join(POLICY_NAMES)}")
        return policy


class RollbackBundleSpec(_Section):
    """A bundle every engine pod declares (`corral supervise --bundle`, from a ConfigMap): the engine
    command as rendered plus these args and env. A failed start rolls back to it under
    `supervisor.on_startup_failure: rollback`, and `POST /v1/bundle` may switch to it."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="the bundle's name (letters, digits, '.', '_', '-'); not 'initial' (the rendered "
        "command's)",
    )
    engine_args: list[str] = Field(
        default_factory=list, description="vLLM flags added to the rendered engine command"
    )
    env: dict[str, str] = Field(default_factory=dict, description="plain environment variables of the engine")

    @field_validator("engine_args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        return EngineSpec._no_owned_flags(args)

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        return EngineSpec._no_plain_secrets(EngineSpec._env_names(env))


class SupervisorSpec(_Section):
    port: Port = Field(default=8081, description="the supervisor's probe and management port")
    gate_port: Port = Field(
        default=8080,
        description="the pod's data port (the router's --engine-port): the supervisor's admission gate, "
        "which forwards only inference paths to the engine and only while it is READY",
    )
    stall_seconds: float = Field(default=60.0, gt=0, description="--stall-seconds")
    unanswered_seconds: float = Field(
        default=DEFAULT_UNANSWERED_SECONDS,
        ge=0,
        description="--unanswered-seconds: a READY engine whose /health has not answered for this long "
        "leaves routing (the pod unready) until it answers and passes the smoke request; 0: never",
    )
    on_startup_failure: Literal["restart", "stay-unready", "rollback"] = Field(
        default="restart",
        description="what follows a start that cannot reach READY (--on-startup-failure): restart = "
        "/livez 503, the kubelet restarts the container; stay-unready = the pod stays up unready "
        "(/livez and /startupz 200, /readyz 503) for a person to look; rollback = one switch to "
        "supervisor.rollback_bundle",
    )
    rollback_bundle: RollbackBundleSpec | None = Field(
        default=None, description="the bundle a failed start rolls back to: {name, engine_args, env}"
    )
    expect_fingerprint: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{16}$",
        description="the artifact fingerprint the rendered command must have (--expect-fingerprint, 16 "
        "hex digits as `corral status` shows it); PRECHECK refuses a start of another",
    )


class TokenSpec(_Section):
    """The fleet key: each pod's supervisor token is derived from it and the pod's name, by an init
    container in the pod and by the routers, the only places it is mounted."""

    secret_name: str | None = Field(
        default=None,
        pattern=_DNS_LABEL,
        description="Secret holding the fleet key (at least 32 bytes) from which every pod's supervisor "
        "token is derived; null means NAME-corral-token",
    )
    key: str = Field(default="token", min_length=1, description="key of the fleet key inside the Secret")


class SecuritySpec(_Section):
    """The securityContext of every pod and container. vLLM's images run as root unless told
    otherwise; the engine needs no root (the GPUs come from the device plugin), so pods run as
    `run_as_user` by default, and the files they read (model weights, sockets) must be readable by it."""

    run_as_non_root: bool = Field(
        default=True,
        description="runAsNonRoot with run_as_user; false runs as the image's user (root for vLLM images)",
    )
    run_as_user: int = Field(default=1000, ge=0, description="the user every container runs as")
    run_as_group: int = Field(
        default=1000, ge=0, description="its group, also the fsGroup that may read the mounted fleet key"
    )
    read_only_root_filesystem: bool = Field(
        default=True,
        description="the image is read-only; /tmp, HOME (with the Hugging Face and vLLM caches), the "
        "state dir, the token dir and writable_paths are emptyDir volumes",
    )
    writable_paths: list[str] = Field(
        default_factory=list,
        description="further directories the engine writes, each an emptyDir volume, e.g. [/workspace]",
    )

    @field_validator("writable_paths")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not an absolute path")
        return paths


class PeerSpec(_Section):
    namespace_labels: dict[str, str] | None = Field(
        default=None, description="namespaces with these labels (with pod_labels: those pods in them)"
    )
    pod_labels: dict[str, str] | None = Field(
        default=None, description="pods with these labels (in this namespace unless namespace_labels)"
    )

    @field_validator("namespace_labels", "pod_labels")
    @classmethod
    def _label_syntax(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return None if labels is None else _check_labels(labels)


class NetworkPolicySpec(_Section):
    enabled: bool = Field(
        default=True,
        description="render a NetworkPolicy that lets only the routers reach the engine pods' gate and "
        "supervisor ports (the kubelet's probes come from the node and are not affected)",
    )
    supervisor_from: list[PeerSpec] = Field(
        default_factory=list,
        description="peers the engine NetworkPolicy lets in besides the routers, e.g. Prometheus: the "
        "supervisor port (its /metrics; the management API still wants the pod's token) and, with "
        "monitoring.service_monitors on, the gate port too (vLLM's /metrics; inference only reaches a "
        "READY engine); no effect when network_policy.enabled is false",
    )

    @field_validator("supervisor_from")
    @classmethod
    def _peer_named(cls, peers: list[PeerSpec]) -> list[PeerSpec]:
        for i, peer in enumerate(peers):
            if peer.namespace_labels is None and peer.pod_labels is None:
                raise ValueError(f"[{i}] names no peer: give namespace_labels, pod_labels or both")
        return peers


class GatewaySpec(_Section):
    """Corral as the endpoint picker of a Gateway API inference gateway (docs/gateway-epp.md): the
    InferencePool over the engine pods, `corral epp` (Deployment, Service, RBAC), an HTTPRoute."""

    gateway_name: str = Field(
        pattern=_DNS_LABEL, max_length=63, description="the Gateway the rendered HTTPRoute attaches to"
    )
    gateway_namespace: str | None = Field(
        default=None, pattern=_DNS_LABEL, max_length=63, description="its namespace; null: the fleet's"
    )
    failure_mode: Literal["FailClose", "FailOpen"] = Field(
        default="FailClose",
        description="what the gateway does when the picker does not answer: FailClose (the request fails; "
        "nothing reaches an engine the picker has not vouched for, such as a draining one) or FailOpen "
        "(the gateway picks an endpoint of the pool itself, blind to drains and sleep)",
    )
    replicas: int = Field(default=2, ge=1, le=16, description="picker pods; each follows every supervisor")
    grpc_port: Port = Field(default=9002, description="the picker's ext_proc port (endpointPickerRef)")
    http_port: Port = Field(default=9003, description="the picker's probes and /metrics port")
    fallbacks: int = Field(default=2, ge=0, le=16, description="endpoints after the pick, for retries")
    cpu: str | None = Field(default=None, description="CPU request and limit")
    memory: str | None = Field(default=None, description="memory request and limit")
    proxy_from: list[PeerSpec] = Field(
        default_factory=list,
        description="the gateway's proxy pods, let into the engine pods' gate port by the engine "
        "NetworkPolicy (network_policy.enabled): the gateway sends each request there itself",
    )

    @field_validator("proxy_from")
    @classmethod
    def _peer_named(cls, peers: list[PeerSpec]) -> list[PeerSpec]:
        return NetworkPolicySpec._peer_named(peers)


class CorralDeployment(_Section):
    name: str = Field(
        pattern=_NAME,
        max_length=_NAME_MAX,
        description=f"lower-case letters, digits and '-', starting with a letter, at most {_NAME_MAX} "
        "characters; it prefixes every object's name",
    )
    namespace: str = Field(default="default", pattern=_DNS_LABEL, max_length=63, description="a namespace")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels on every object")
    image: str = Field(
        min_length=1,
        description="engine image: vLLM with corral installed; left out: the Corral engine image from "
        "images.registry",
    )
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="where the default images come from")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    replicas: int = Field(ge=1, description="engines (with pd: left out, each role has its own)")
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    gpu: GpuSpec
    dependencies: DependencySpec = Field(default_factory=DependencySpec)
    startup: StartupSpec
    drain: DrainSpec
    probes: ProbeSpec = Field(default_factory=ProbeSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    supervisor: SupervisorSpec = Field(default_factory=SupervisorSpec)
    token: TokenSpec = Field(default_factory=TokenSpec)
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, description="Grafana dashboard, alerts and ServiceMonitors (all off)"
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description="an HPA or a KEDA ScaledObject on the router's desired replica count (off; "
        "docs/scaling.md)",
    )
    gateway: GatewaySpec | None = Field(
        default=None,
        description="Corral as a Gateway API inference gateway's endpoint picker: {gateway_name, "
        "failure_mode, replicas, grpc_port, ...} (docs/gateway-epp.md); null: none",
    )
    kv_events: KvEventsSpec = Field(
        default_factory=KvEventsSpec,
        description="the engines' KV-cache events to the routers: {enabled, port, replay_port} (on where "
        "the config allows it; render says why per engine group)",
    )
    preload: PreloadSpec = Field(
        default_factory=PreloadSpec,
        description="vLLM's weight-cache daemon in every engine pod: {enabled, mode, fallback, "
        "health_port} (off)",
    )
    pd: PdSpec | None = Field(
        default=None,
        description="a prefill/decode fleet: {kv_transfer_config, side_channel_port, prefill: {replicas, "
        "gpu_capacity, ...}, decode: {...}} instead of replicas and gpu.capacity",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_images(cls, data: Any) -> Any:
        return fill_default_images(data)

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, labels: dict[str, str]) -> dict[str, str]:
        return _check_labels(labels)

    @model_validator(mode="after")
    def _preload_fits(self) -> CorralDeployment:
        found = preload_problems(self.preload, self.engine.args, self.engine.pipeline_parallel_size)
        if self.preload.enabled and self.pd is not None:
            found.append("preload is not rendered for a prefill/decode fleet; turn preload off or drop pd")
        if found:
            raise ValueError("preload: " + "; ".join(found))
        return self

    @model_validator(mode="after")
    def _autoscaling_fits(self) -> CorralDeployment:
        if not self.autoscaling.enabled:
            return self
        if self.pd is not None:
            raise ValueError("autoscaling: not rendered for a prefill/decode fleet; turn it off or drop pd")
        if not self.monitoring.service_monitors:
            raise ValueError(
                "autoscaling: the router's desired replica count reaches Prometheus through its "
                "ServiceMonitor; set monitoring.service_monitors: true"
            )
        return self

    @property
    def token_secret(self) -> str:
        return self.token.secret_name or f"{self.name}-corral-token"

    @property
    def router_admin_secret(self) -> str:
        return self.router.admin_key.secret_name or f"{self.name}-corral-router-admin"

    @property
    def engine_api_key(self) -> SecretRef | None:
        """Where the engines' vLLM API key comes from, when they enforce one (VLLM_API_KEY)."""
        return self.engine.secret_env.get("VLLM_API_KEY")
