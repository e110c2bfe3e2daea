"""Pods become endpoints: a pod is routable only while it has an IP, is Ready and is not terminating,
and its endpoint becomes READY only after its /v1/models answered.

Intake (`apply`, `replace`) runs in the informer's order and never waits: anything that takes an
endpoint out of routing — a DELETE, NotReady, a lost IP, a deletionTimestamp, absence from a
re-list — is applied to membership right there. Only the slow part, asking a newly routable pod's
/v1/models, goes through the keyed work queue to a pool of workers, each call with a timeout; a
probe answer is applied only if the pod is still, by then, the same routable pod.

A pod whose engine runs under `corral supervise` names the supervisor's port in the annotation
`corral.dev/supervisor-port` (or every pod has one at `--supervisor-port`): its endpoint then also
follows the supervisor's state stream on the pod IP and is routable only while the stream says READY.

Pods labelled `corral.dev/serving-group=NAME`, with the group's pod count in the annotation (or label)
`corral.dev/serving-group-size`, are one serving group: routed to only while every one of them is
READY on one bundle fingerprint. A pod whose group size is missing or not a number keeps its group
out of routing (its reason says which pod and what to fix) rather than routing it alone. The label
`corral.dev/role=prefill|decode|both` declares the pod's role in prefill/decode disaggregation (its
supervisor's word wins); a pod with another value stays out of routing, its reason naming the fix.
The annotation `corral.dev/kv-events` (`PUB[,REPLAY]`, e.g. `tcp://*:5557,tcp://*:5558`) says where the
pod's engine publishes KV-cache events, a wildcard host meaning the pod IP (its supervisor's word wins).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.aio import cancel_tasks
from corral.engine.models_probe import PROBE_FAILURES, describe, probe_models
from corral.engine.page_get import PageClient
from corral.engine.pd_protocol import ROLES
from corral.engine_state import EngineState
from corral.k8s.watch.client import PodApi, PodList, WatchEvent
from corral.k8s.watch.informer import InformerConfig, PodInformer
from corral.k8s.watch.workqueue import KeyedQueue, QueueShutDown
from corral.pod_labels import (
    KV_EVENTS_ANNOTATION,
    ROLE_LABEL,
    SERVING_GROUP_LABEL,
    SERVING_GROUP_SIZE_ANNOTATION,
    SUPERVISOR_PORT_ANNOTATION,
)
from corral.router.discovery.engine_identity import probe_pairing
from corral.router.membership.endpoint import SupervisorView
from corral.router.membership.events import EndpointAdded, EndpointRemoved, EndpointUpdated, MembershipSink
from corral.router.membership.group_tag import GroupTag, GroupTagError, group_tag
from corral.router.telemetry.metrics import RouterMetrics

log = logging.getLogger("corral.router.k8s.pod_source")

SOURCE = "k8s"


@dataclass(frozen=True, slots=True)
class PodView:
    """What routing needs of one pod, at one resourceVersion."""

    key: str  # namespace/name
    uid: str
    ip: str | None
    ready: bool
    terminating: bool
    phase: str
    status_reason: str
    version: str
    deleted: bool = False
    gone_why: str = ""  # for a deletion: the DELETED event, or absence from a re-list
    supervisor_port: int | None = None  # from the corral.dev/supervisor-port annotation
    group: GroupTag | None = None  # from the corral.dev/serving-group label (and its size)
    group_error: str = ""  # the pod says it is in a group but its group marker is unusable
    role: str | None = None  # from the corral.dev/role label
    role_error: str = ""  # the label names no role
    kv_events: str | None = None  # from the corral.dev/kv-events annotation (tcp://*:5557 on the pod IP)

    def blocker(self) -> tuple[str, str] | None:
        """(cause, reason) that keeps this pod out of routing, or None when it is routable."""
        if self.deleted:
            why = self.gone_why or "DELETED event"
            return (self.gone_why or "deleted", f"pod {self.key} deleted ({why})")
        if self.terminating:
            return ("terminating", f"pod {self.key} is terminating (deletionTimestamp set)")
        if not self.ip:
            why = f"phase {self.phase}" + (f", reason {self.status_reason}" if self.status_reason else "")
            return ("no_ip", f"pod {self.key} has no IP ({why})")
        if not self.ready:
            return ("not_ready", f"pod {self.key} is not Ready (phase {self.phase})")
        if self.group_error:
            return ("bad_group", f"pod {self.key}: {self.group_error}")
        if self.role_error:
            return ("bad_role", f"pod {self.key}: {self.role_error}")
        return None


def pod_view(obj: dict[str, Any], deleted: bool = False, gone_why: str = "") -> PodView:
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )
    annotations = metadata.get("annotations") or {}
    port_text = annotations.get(SUPERVISOR_PORT_ANNOTATION) if isinstance(annotations, dict) else None
    supervisor_port: int | None = None
    if port_text is not None:
        try:
            supervisor_port = int(port_text)
        except (TypeError, ValueError):
            log.warning("pod annotation %s=%r is not a port; ignored", SUPERVISOR_PORT_ANNOTATION, port_text)
    group, group_error = _serving_group(metadata)
    labels = metadata.get("labels")
    role = labels.get(ROLE_LABEL) if isinstance(labels, dict) else None
    if role == "engine":  # what `corral k8s render` labels an aggregated fleet's engine pods (its selector)
        role = "both"
    role_error = ""
    if role is not None and role not in ROLES:
        role_error = f"label {ROLE_LABEL}={role!r} is not a role; label it one of {', '.join(ROLES)}"
        role = None
    kv_events = annotations.get(KV_EVENTS_ANNOTATION) if isinstance(annotations, dict) else None
    return PodView(
        kv_events=kv_events if isinstance(kv_events, str) else None,
        role=role,
        role_error=role_error,
        group=group,
        group_error=group_error,
        supervisor_port=supervisor_port if supervisor_port and 0 < supervisor_port < 65536 else None,
        key=f"{metadata.get('namespace', '')}/{metadata.get('name', '')}",
        uid=str(metadata.get("uid", "")),
        ip=status.get("podIP") or None,
        ready=ready,
        terminating=bool(metadata.get("deletionTimestamp")),
        phase=str(status.get("phase", "Unknown")),
        status_reason=str(status.get("reason", "")),
        version=str(metadata.get("resourceVersion", "")),
        deleted=deleted,
        gone_why=gone_why,
    )


def _serving_group(metadata: dict[str, Any]) -> tuple[GroupTag | None, str]:
    """The pod's serving group from its label and size (annotation, else label), or why it has none."""
    labels, annotations = metadata.get("labels"), metadata.get("annotations")
    labels = labels if isinstance(labels, dict) else {}
    annotations = annotations if isinstance(annotations, dict) else {}
    name = labels.get(SERVING_GROUP_LABEL)
    if not isinstance(name, str):
        return None, ""
    size = annotations.get(SERVING_GROUP_SIZE_ANNOTATION, labels.get(SERVING_GROUP_SIZE_ANNOTATION))
    if size is None:
        return None, (
            f"label {SERVING_GROUP_LABEL}={name} without {SERVING_GROUP_SIZE_ANNOTATION}; "
            "annotate the pods of a serving group with its pod count"
        )
    try:
        return group_tag(name, size), ""
    except GroupTagError as exc:
        return None, f"{exc} (label {SERVING_GROUP_LABEL}, annotation {SERVING_GROUP_SIZE_ANNOTATION})"


@dataclass(frozen=True, slots=True)
class PodSourceConfig:
    engine_port: int = 8000
    scheme: str = "http"
    probe_timeout: float = 2.0
    probe_retry_seconds: float = 1.0
    workers: int = 16
    informer: InformerConfig = field(default_factory=InformerConfig)
    supervisor_port: int | None = None  # every pod's supervisor port, unless its annotation says
    # sent with each /v1/models probe: the engine API key (--engine-api-key-file), when engines want one
    probe_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # how often a routable pod's /v1/models is read again (0: only when the pod changes): what its
    # engine serves moves without any pod change when a LoRA adapter is loaded or unloaded at run time
    models_refresh_seconds: float = 0.0


class PodSource:
    def __init__(
        self, sink: MembershipSink, metrics: RouterMetrics, api: PodApi, config: PodSourceConfig
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self._api = api
        self._config = config
        self._views: dict[str, PodView] = {}  # latest view of every pod still in the API server
        self._members: dict[str, tuple[str, str]] = {}  # pod key -> (identity, url) of its endpoint
        self._at: dict[str, str] = {}  # url -> the pod key whose endpoint is there
        self._answered: set[str] = set()  # pod keys whose /v1/models answered since they became routable
        # whether any pod was labelled prefill or decode: only then is an engine's pairing identity asked
        # for (an aggregated fleet's engines get no extra request)
        self._pd_seen = False
        self._queue: KeyedQueue[str, PodView] = KeyedQueue()
        self.informer = PodInformer(
            api, self, config.informer, on_relist=metrics.count_relist, on_event=self._count_event
        )
        self._session: PageClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._retries: set[asyncio.TimerHandle] = set()

    def _count_event(self, kind: str) -> None:
        self._metrics.count_event(SOURCE, kind)

    def url_of(self, ip: str, port: int | None = None) -> str:
        host = f"[{ip}]" if ":" in ip else ip
        return f"{self._config.scheme}://{host}:{port or self._config.engine_port}"

    def _supervisor_of(self, view: PodView) -> SupervisorView | None:
        port = view.supervisor_port or self._config.supervisor_port
        if port is None or not view.ip:
            return None
        return SupervisorView(self.url_of(view.ip, port))

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = PageClient(self._config.probe_timeout, keepalive=0.0)  # asked once per pod change
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._work(), name=f"corral-router-k8s-worker-{i}")
            for i in range(self._config.workers)
        ]
        self._tasks.append(loop.create_task(self.informer.run(), name="corral-router-k8s-informer"))
        if self._config.models_refresh_seconds > 0:
            self._tasks.append(loop.create_task(self._refresh(), name="corral-router-k8s-models-refresh"))

    async def _refresh(self) -> None:
        """Ask every answered pod's /v1/models again, through the same queue and workers, the pods
        spread over the interval (a large fleet is not asked all at once)."""
        every = self._config.models_refresh_seconds
        while True:
            keys = list(self._answered)
            if not keys:
                await asyncio.sleep(every)
            for key in keys:
                view = self._views.get(key)
                if view is not None and key in self._answered:
                    self._queue.put(key, view)
                await asyncio.sleep(every / len(keys))

    async def stop(self) -> None:
        self._queue.shut_down()
        for handle in self._retries:
            handle.cancel()
        await cancel_tasks(*self._tasks)
        self._tasks = []
        if self._session is not None:
            self._session.close()
            self._session = None
        await self._api.close()

    # -- intake: in event order, never waits ---------------------------------------------------

    def apply(self, event: WatchEvent) -> None:
        deleted = event.type == "DELETED"
        view = pod_view(event.obj, deleted=deleted)
        self._intake(view, event.received)

    def replace(self, listed: PodList) -> None:
        seen: set[str] = set()
        for obj in listed.items:
            view = pod_view(obj)
            seen.add(view.key)
            self._intake(view, listed.received)
        for key in [k for k in self._views if k not in seen]:
            last = self._views[key]
            gone = PodView(
                key=key,
                uid=last.uid,
                ip=last.ip,
                ready=False,
                terminating=False,
                phase=last.phase,
                status_reason="",
                version=listed.resource_version,
                deleted=True,
                gone_why="absent_on_relist",
            )
            log.warning(
                "pod %s is absent from the list at resourceVersion %s: its DELETE was never seen",
                key,
                listed.resource_version,
            )
            self._intake(gone, listed.received)

    def _intake(self, view: PodView, received: float) -> None:
        key = view.key
        previous = self._views.get(key)
        if view.deleted:
            self._views.pop(key, None)
        else:
            self._views[key] = view
            self._pd_seen = self._pd_seen or view.role in ("prefill", "decode")
        blocker = view.blocker()
        url = self.url_of(view.ip) if view.ip and not view.deleted else None

        member = self._members.get(key)
        # An endpoint is the pod it runs in: a pod recreated under the same name (a new UID, say a
        # StatefulSet pod whose DELETE was missed) is a new endpoint, even at the same IP.
        replaced = previous is not None and not view.deleted and previous.uid != view.uid
        # a new role label makes a new endpoint, as a new address does: nothing routed for the old role stays
        recast = previous is not None and not view.deleted and previous.role != view.role
        if member is not None and (member[1] != url or replaced or recast):
            if replaced and previous is not None:
                cause, reason = "pod_replaced", f"pod {key} was recreated (uid {previous.uid} -> {view.uid})"
            elif recast and previous is not None:
                cause, reason = (
                    "role_changed",
                    f"pod {key} relabelled {ROLE_LABEL}: {previous.role} -> {view.role}",
                )
            else:
                cause, reason = blocker or ("ip_changed", f"pod {key} now has IP {view.ip}")
            self._leave(key, reason, cause, view.version, received)
        if url is None:
            return

        holder = self._at.get(url)
        if holder is not None and holder != key:
            # The IP now belongs to another pod: the old owner is gone even if its DELETE is not here yet.
            self._leave(holder, f"IP {view.ip} now belongs to pod {key}", "ip_reused", view.version, received)
        if key not in self._members:
            identity = view.uid or key
            supervisor = self._supervisor_of(view)
            self._sink.emit(
                EndpointAdded(
                    identity=identity,
                    url=url,
                    source=SOURCE,
                    reason="pod seen, not yet checked",
                    origin=f"pod {key}",
                    name=key,
                    supervisor_url=supervisor.url if supervisor is not None else None,
                    event_version=view.version,
                    group=view.group,
                    role=view.role,
                    kv_events=view.kv_events,
                )
            )
            self._members[key] = (identity, url)
            self._at[url] = key
        identity = self._members[key][0]

        if blocker is not None:
            cause, reason = blocker
            state = EngineState.STOPPING if view.terminating else EngineState.STARTING
            self._answered.discard(key)
            self._sink.emit(
                EndpointUpdated(
                    identity, reason, state=state, cause=cause, event_version=view.version, received=received
                )
            )
            return
        if key in self._answered:
            self._sink.emit(EndpointUpdated(identity, None, event_version=view.version))
            return
        self._sink.emit(
            EndpointUpdated(
                identity,
                f"pod {key} Ready; waiting for /v1/models",
                state=EngineState.STARTING,
                cause="probe",
                event_version=view.version,
            )
        )
        self._queue.put(key, view)

    def _leave(self, key: str, reason: str, cause: str, version: str, received: float) -> None:
        """Remove pod `key`'s endpoint now; its exit is timed from the arrival of what caused it."""
        member = self._members.pop(key, None)
        if member is None:
            return
        identity, url = member
        if self._at.get(url) == key:
            del self._at[url]
        self._answered.discard(key)
        self._sink.emit(
            EndpointRemoved(identity, reason, cause=cause, event_version=version, received=received)
        )

    # -- slow work: /v1/models, concurrently, each with a timeout ------------------------------

    def _current(self, key: str, view: PodView) -> bool:
        """Whether `view` still describes the routable pod the API server has now."""
        latest = self._views.get(key)
        member = self._members.get(key)
        return (
            latest is not None
            and latest.blocker() is None
            and latest.uid == view.uid
            and latest.ip == view.ip
            and member is not None
            and member[1] == self.url_of(view.ip or "")
        )

    async def _work(self) -> None:
        while True:
            try:
                key, view = await self._queue.get()
            except QueueShutDown:
                return
            try:
                await self._enrich(key, view)
            except Exception:
                log.exception("enriching pod %s failed", key)
            finally:
                self._queue.done(key)

    async def _enrich(self, key: str, view: PodView) -> None:
        if not self._current(key, view) or self._session is None or view.ip is None:
            return
        url = self.url_of(view.ip)
        refresh = key in self._answered
        try:
            cards = await probe_models(self._session, url, self._config.probe_headers)
        except PROBE_FAILURES as exc:
            if refresh:  # its state is the pod's and its supervisor's; the next refresh asks again
                log.debug("pod %s: /v1/models refresh failed: %s", key, describe(exc))
                return
            if self._current(key, view):
                identity = self._members[key][0]
                self._sink.emit(EndpointUpdated(identity, f"pod {key} Ready; /v1/models: {describe(exc)}"))
                self._retry_later(key)
            return
        if refresh:
            if self._current(key, view) and key in self._answered:
                models = frozenset(c["id"] for c in cards)
                identity, said = self._members[key][0], f"pod {key} Ready and /v1/models answered"
                self._sink.emit(EndpointUpdated(identity, said, models=models, model_cards=cards))
            return
        pairing = None
        if self._pd_seen:
            pairing = await probe_pairing(self._session, url, cards, self._config.probe_headers)
        if not self._current(key, view):
            return  # deleted, unready or moved while the probe ran: the answer is stale
        self._answered.add(key)
        self._sink.emit(
            EndpointUpdated(
                self._members[key][0],
                f"pod {key} Ready and /v1/models answered",
                state=EngineState.READY,
                models=frozenset(c["id"] for c in cards),
                model_cards=cards,
                pairing=pairing,
            )
        )

    def _retry_later(self, key: str) -> None:
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._retries.discard(handle)
            latest = self._views.get(key)
            if latest is not None and key in self._members and key not in self._answered:
                self._queue.put(key, latest)

        handle = loop.call_later(self._config.probe_retry_seconds, again)
        self._retries.add(handle)
