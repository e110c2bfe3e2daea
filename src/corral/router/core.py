"""The routing core that every front door of Corral shares: membership and the source that fills it
(static list, backends file or Kubernetes pods), the supervisor state streams that acknowledge removals,
the adapter carry, the engines' KV-event feeds, the prefix memory and the routing policies, started and
stopped together. The router's HTTP proxy (corral.router.app) and the Gateway API endpoint picker
(corral.epp) each build one and decide with it; neither copies it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from corral.k8s.watch.client import PodApi
from corral.router.discovery.adapter_carry import AdapterCarry, CarrySettings
from corral.router.discovery.backends_file import FileSource
from corral.router.discovery.kv_events_feed import KvEventFeeds
from corral.router.discovery.static import StaticSource
from corral.router.discovery.supervisor_stream import StreamSettings, SupervisorStreams
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.membership import Membership, RoutingExit
from corral.router.routing.config import RoutingConfig
from corral.router.routing.kv_holders import KvPrefixHolders
from corral.router.routing.kv_index import KvIndex
from corral.router.routing.prefix_memory import PrefixMemory
from corral.router.routing.prompt_tokens import prompt_tokens
from corral.router.routing.selector import Routing
from corral.router.telemetry.metrics import RouterMetrics


@dataclass(frozen=True, slots=True)
class KubernetesDiscovery:
    namespace: str
    selector: str
    kubeconfig: str | None = None  # None: the in-cluster service account
    engine_port: int = 8000
    resync_seconds: float = 60.0
    watch_timeout_seconds: int = 300
    probe_workers: int = 16
    supervisor_port: int | None = None  # pods without the corral.dev/supervisor-port annotation


class CoreConfig(Protocol):
    """What the core reads of the configuration (corral.router.app.CoreConfig has it all)."""

    @property
    def backends(self) -> Sequence[str]: ...
    @property
    def supervisors(self) -> Mapping[str, str]: ...
    @property
    def roles(self) -> Mapping[str, str]: ...
    @property
    def backends_file(self) -> Path | None: ...
    @property
    def kubernetes(self) -> KubernetesDiscovery | None: ...
    @property
    def policy(self) -> str: ...
    @property
    def session_header(self) -> str: ...
    @property
    def routing(self) -> RoutingConfig: ...
    @property
    def slow_start_seconds(self) -> float: ...
    @property
    def models_refresh_seconds(self) -> float: ...
    @property
    def probe_timeout(self) -> float: ...
    @property
    def streams(self) -> StreamSettings: ...
    @property
    def carry_adapters(self) -> CarrySettings | None: ...
    @property
    def tokenizer(self) -> str | None: ...

    def engine_headers(self) -> dict[str, str]: ...


class MembershipSource(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


PodApiFactory = Callable[[KubernetesDiscovery], Awaitable[PodApi]]


async def connect_pod_api(discovery: KubernetesDiscovery) -> PodApi:
    from corral.k8s.watch.client import KubePodApi

    return await KubePodApi.connect(discovery.namespace, discovery.selector, discovery.kubeconfig)


def source_name(config: CoreConfig) -> str:
    if config.kubernetes is not None:
        return "k8s"
    return "file" if config.backends_file is not None else "static"


async def build_source(
    config: CoreConfig, membership: Membership, metrics: RouterMetrics, pod_api: PodApiFactory
) -> MembershipSource:
    # every source's events go through this one writer of membership
    consumer = MembershipConsumer(membership, metrics.removal_latency.observe)
    if config.kubernetes is not None:
        from corral.k8s.watch.informer import InformerConfig
        from corral.router.discovery.k8s_pods import PodSource, PodSourceConfig

        k8s = config.kubernetes
        return PodSource(
            consumer,
            metrics,
            await pod_api(k8s),
            PodSourceConfig(
                engine_port=k8s.engine_port,
                probe_timeout=config.probe_timeout,
                workers=k8s.probe_workers,
                supervisor_port=k8s.supervisor_port,
                probe_headers=config.engine_headers(),
                models_refresh_seconds=config.models_refresh_seconds,
                informer=InformerConfig(
                    resync_seconds=k8s.resync_seconds, watch_timeout_seconds=k8s.watch_timeout_seconds
                ),
            ),
        )
    if config.backends_file is not None:
        return FileSource(
            consumer,
            config.backends_file,
            config.models_refresh_seconds,
            config.probe_timeout,
            metrics,
            probe_headers=config.engine_headers(),
        )
    return StaticSource(
        consumer,
        config.backends,
        config.models_refresh_seconds,
        config.probe_timeout,
        metrics=metrics,
        supervisors=config.supervisors,
        probe_headers=config.engine_headers(),
        roles=config.roles,
    )


class RouterCore:
    """What decides where a request goes, built from the router's configuration; `start` and `stop`
    run its background parts (source, streams, carry, scraper, KV feeds) in the router's order."""

    def __init__(self, config: CoreConfig, metrics: RouterMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.prefix_memory = PrefixMemory(
            block_chars=config.routing.block_chars, key_blocks=config.routing.key_blocks
        )
        self.membership = Membership(on_exit=self._left_routing)
        # The engines' KV events, when the router can tokenize as they do (issue 17)
        kv_tokens = prompt_tokens(config.tokenizer)
        self.kv_feeds = (
            KvEventFeeds(KvIndex(), self.membership.endpoints, refusals=self.metrics.engine_input)
            if kv_tokens is not None
            else None
        )
        self.streams = SupervisorStreams(self.membership, self.metrics, config.streams)
        self.carry = (
            AdapterCarry(self.membership, config.streams.token_for, config.carry_adapters)
            if config.carry_adapters is not None
            else None
        )
        kv_feeds, refusals = self.kv_feeds, self.metrics.engine_input
        self.routing = Routing(
            config.policy,
            config.routing,
            config.session_header,
            self.membership.endpoints,
            prefix_memory=self.prefix_memory,
            slow_start_seconds=config.slow_start_seconds,
            prefix_holders=(
                KvPrefixHolders(
                    kv_feeds.index,
                    kv_tokens,
                    kv_feeds.publishing,
                    self.prefix_memory,
                    self.metrics.engine_input,
                )
                if kv_feeds is not None and kv_tokens is not None
                else None
            ),
            refusals=refusals,
        )
        self._source: MembershipSource | None = None

    def _left_routing(self, record: RoutingExit) -> None:
        self.metrics.count_removal(record.cause)
        if record.kind == "removed":
            self.prefix_memory.forget(record.url, f"left membership ({record.cause})")
            if self.kv_feeds is not None:
                self.kv_feeds.forget(record.url, f"left membership ({record.cause})")

    async def start_streams(self, pod_api: PodApiFactory = connect_pod_api) -> None:
        """The supervisor streams, the adapter carry and the membership source (built here: a
        Kubernetes source connects first); on a failure to build the source, what started is stopped."""
        await self.streams.start()
        if self.carry is not None:
            await self.carry.start()
        try:
            self._source = await build_source(self.config, self.membership, self.metrics, pod_api)
        except BaseException:
            if self.carry is not None:
                await self.carry.stop()
            await self.streams.stop()
            raise

    async def start_routing(self) -> None:
        """The source's events, then the policies' scraper and the KV-event feeds."""
        assert self._source is not None, "start_streams first"
        await self._source.start()
        await self.routing.start()
        if self.kv_feeds is not None:
            await self.kv_feeds.start()

    async def start(self, pod_api: PodApiFactory = connect_pod_api) -> None:
        await self.start_streams(pod_api)
        await self.start_routing()

    async def stop(self) -> None:
        if self.kv_feeds is not None:
            await self.kv_feeds.stop()
        await self.routing.stop()
        if self._source is not None:
            await self._source.stop()
        if self.carry is not None:
            await self.carry.stop()
        await self.streams.stop()
