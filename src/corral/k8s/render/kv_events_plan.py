"""Whether each engine group of a rendered deployment publishes its KV-cache events to the routers, and
why (the aggregated engines, or each P/D role), and what render adds for a group that does: vLLM's
`--kv-events-config` binding a ZMQ publisher and replay socket on the pod IP, their named container
ports, the pod annotation the router's pod source reads, the NetworkPolicy ports opened to the router
pods only (the events carry prompt tokens), and the router's `--tokenizer`.

A group publishes only when every condition holds, checked in this order, the first that fails being
the reason given: `kv_events.enabled`; the NetworkPolicy on; prefix caching not disabled in the engine's
args; one data-parallel rank per engine (vLLM's ranks each publish their own cache on PORT + rank, while
its API server picks the rank, so no one address says what a pod holds); a router that places this
group's requests by prefix (`router.policy` prefix or load; a P/D fleet's decode legs are always placed
by `load`, which scores held prefixes); and `router.tokenizer`, since the router keys prompts as the
engine does only with the engine's tokenizer. Each pod runs one engine, so one address per pod."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from corral.engine.flags import flag_value
from corral.engine.kv_events_address import KV_EVENTS_FLAG, KvEventsAddress
from corral.k8s.render.config import CorralDeployment
from corral.k8s.render.images_config import VLLM_VERSION, engine_image
from corral.k8s.render.pd_config import ROLES, Role

REASON_ANNOTATION = "corral.dev/kv-events-reason"  # on the engine Deployment: why events are on or off
PORT_NAME = "kv-events"  # container port names: at most 15 characters
REPLAY_PORT_NAME = "kv-replay"
# The router's `--tokenizer sim` (routing/prompt_tokens.py's SIM_TOKENIZER; render imports nothing from
# routing beyond its names): corral sim's own tokenizer, which needs no `transformers`.
SIM_TOKENIZER = "sim"
# The built-in policies that place a request by the prefixes engines hold (a KV index, when fed).
PREFIX_POLICIES = ("prefix", "load")
AGGREGATED = "engine"  # the group name of a fleet without pd: its one engine Deployment
_PREFIX_CACHING = ("--enable-prefix-caching", "--no-enable-prefix-caching")


@dataclass(frozen=True)
class KvEventsDecision:
    """One engine group's KV events: on or off, and why in a sentence a person can act on."""

    group: str
    on: bool
    why: str

    def text(self) -> str:
        return f"{'on' if self.on else 'off'}: {self.why}"


def prefix_caching_disabled(args: Sequence[str]) -> bool:
    """Whether vLLM runs `args` without prefix caching (the last of --[no-]enable-prefix-caching wins;
    vLLM's engine turns it on by default)."""
    last = [a for a in args if a in _PREFIX_CACHING]
    return bool(last) and last[-1] == "--no-enable-prefix-caching"


def _data_parallel(args: Sequence[str]) -> str | None:
    value = flag_value(args, "--data-parallel-size", "-dp")
    return value if value is not None and value.strip() != "1" else None


def group_args(config: CorralDeployment, group: str) -> list[str]:
    """The vLLM flags the config gives one group's engines (a P/D role's added to engine.args)."""
    if config.pd is None or group == AGGREGATED:
        return list(config.engine.args)
    role: Role = "prefill" if group == "prefill" else "decode"
    return [*config.engine.args, *config.pd.role(role).args]


def groups(config: CorralDeployment) -> tuple[str, ...]:
    return (AGGREGATED,) if config.pd is None else ROLES


def decide(config: CorralDeployment, group: str) -> KvEventsDecision:
    """Whether `group`'s engines publish KV events to the routers; the first unmet condition is why not."""
    args = group_args(config, group)
    policy = config.router.policy
    tokenizer = config.router.tokenizer

    def off(why: str) -> KvEventsDecision:
        return KvEventsDecision(group, False, why)

    if not config.kv_events.enabled:
        return off("kv_events.enabled is false in the config")
    if not config.network_policy.enabled:
        return off(
            "network_policy.enabled is false: the events carry prompt tokens, and without the "
            "NetworkPolicy any pod in the cluster could read them; turn the NetworkPolicy on to publish them"
        )
    if prefix_caching_disabled(args):
        return off("prefix caching is disabled in the engine's args (--no-enable-prefix-caching)")
    dp = _data_parallel(args)
    if dp is not None:
        return off(
            f"--data-parallel-size {dp}: each rank publishes its own cache on its own port while vLLM's "
            "API server picks the rank, so no one address says what a pod holds (the router's prefix "
            "memory routes it)"
        )
    if group != "decode" and policy not in PREFIX_POLICIES:
        return off(
            f"router.policy {policy} does not place requests by prefix; set router.policy: prefix "
            "(or load) to route by the prefixes each engine holds"
        )
    if tokenizer is None:
        return off(
            "router.tokenizer is not set, so the router cannot key prompts as the engines do (the Corral "
            "router image has no `transformers`); set it to the model's tokenizer in a router image that "
            "has the package (docs/kubernetes.md)"
        )
    placed = (
        "the router places decode legs by load, which scores held prefixes"
        if group == "decode"
        else f"router.policy {policy} places by prefix"
    )
    why = f"prefix caching on, {placed}, the router tokenizes with {tokenizer}"
    if config.image != engine_image(config.images.registry):
        why += f"; the engine image is not Corral's: it must run vLLM >= {VLLM_VERSION}"
    return KvEventsDecision(group, True, why)


def decisions(config: CorralDeployment) -> dict[str, KvEventsDecision]:
    """Every engine group's decision, by group name (`engine`, or `prefill` and `decode`)."""
    return {g: decide(config, g) for g in groups(config)}


def replicas_apart(config: CorralDeployment) -> str | None:
    """A warning when several router replicas place prompts by prefix for an engine group without KV
    events: each replica then learns only its own picks and places a prefix where another already
    has (issue 28: two replicas 14x the oracle's TTFT p90, four 21x); None otherwise."""
    replicas = config.router.replicas
    if replicas < 2:
        return None
    if config.router.policy not in PREFIX_POLICIES:  # decode legs go by load, but a decode engine
        return None  # is chosen for the KV it receives, not for what it cached before
    blind = [d.group for d in decisions(config).values() if not d.on and d.group != "decode"]
    if not blind:
        return None
    return (
        f"router.replicas {replicas} place prompts by prefix without KV events for {', '.join(blind)}: "
        "each replica learns only its own picks and places a prefix another replica already placed "
        "(benchmarks/RESULTS.md: two replicas 14x the oracle's TTFT p90); turn the events on (the "
        "reason is below) or run one router replica"
    )


def any_on(config: CorralDeployment) -> bool:
    return any(d.on for d in decisions(config).values())


def address(config: CorralDeployment) -> KvEventsAddress:
    """Where an engine pod publishes, as the pod annotation and the router read it: the wildcard host
    is the pod IP to a subscriber."""
    spec = config.kv_events
    return KvEventsAddress(f"tcp://*:{spec.port}", f"tcp://*:{spec.replay_port}")


def publishing(config: CorralDeployment) -> CorralDeployment:
    """The deployment as a publishing group's engines run it: `--kv-events-config` after its args."""
    engine = config.engine.model_copy(update={"args": [*config.engine.args, *engine_flag(config)]})
    return config.model_copy(update={"engine": engine})


def engine_flag(config: CorralDeployment) -> list[str]:
    """`--kv-events-config` as compact JSON with sorted keys (it is in the bundle's fingerprint): a ZMQ
    publisher and replay socket bound on every interface of the pod (vLLM binds only a wildcard host;
    any other address it connects out to)."""
    where = address(config)
    body = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": where.endpoint,
        "replay_endpoint": where.replay,
    }
    return [KV_EVENTS_FLAG, json.dumps(body, sort_keys=True, separators=(",", ":"))]


def container_ports(config: CorralDeployment) -> tuple[dict[str, object], ...]:
    spec = config.kv_events
    return (
        {"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"},
        {"name": REPLAY_PORT_NAME, "containerPort": spec.replay_port, "protocol": "TCP"},
    )


def policy_ports(config: CorralDeployment) -> list[dict[str, object]]:
    """The ports the engine NetworkPolicy opens to the router pods (and no other peer)."""
    spec = config.kv_events
    return [{"port": spec.port, "protocol": "TCP"}, {"port": spec.replay_port, "protocol": "TCP"}]
