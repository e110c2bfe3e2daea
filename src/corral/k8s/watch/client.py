"""A thin pod list/watch client. `kubernetes-asyncio` does what a library is worth having for here —
kubeconfig and in-cluster configuration, TLS, auth plugins and token refresh, the request
shape — and answers raw: the bodies are decoded here with orjson into plain dicts, and the watch
stream is read line by line here, so that expiry (410) and broken streams surface as two named
exceptions the informer acts on, and nothing retries behind its back."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

WATCH_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


@dataclass(frozen=True, slots=True)
class PodList:
    items: list[dict[str, Any]]
    resource_version: str
    received: float  # time.monotonic() when the body was read


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    obj: dict[str, Any]
    resource_version: str
    received: float  # time.monotonic() when the line was read


class WatchExpired(Exception):
    """410 Gone: the resourceVersion is older than the server's history; only a re-list helps."""


class KubeApiError(Exception):
    """The API server answered with an error, or the connection to it failed or broke."""


class PodApi(Protocol):
    """What the informer needs from the API server: list, and watch from a version."""

    async def list_pods(self) -> PodList: ...

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> AsyncIterator[WatchEvent]: ...

    async def close(self) -> None: ...


def _status_error(status: int, body: bytes, what: str) -> Exception:
    message = body[:300].decode(errors="replace")
    try:
        payload = orjson.loads(body)
        if isinstance(payload, dict) and isinstance(payload.get("message"), str):
            message = payload["message"]
    except orjson.JSONDecodeError:
        pass
    if status == 410:
        return WatchExpired(f"{what}: 410 Gone: {message}")
    return KubeApiError(f"{what}: HTTP {status}: {message}")


def parse_watch_line(line: bytes, received: float) -> WatchEvent:
    """One line of a watch stream; ERROR events raise (410 as WatchExpired)."""
    try:
        payload = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise KubeApiError(f"watch stream sent a line that is not JSON ({exc}): {line[:200]!r}") from None
    if not isinstance(payload, dict):
        raise KubeApiError(f"watch stream sent a non-object line: {line[:200]!r}")
    kind = payload.get("type")
    obj = payload.get("object")
    if not isinstance(obj, dict):
        raise KubeApiError(f"watch event without an object: {line[:200]!r}")
    if kind == "ERROR":
        code = obj.get("code")
        message = f"watch ERROR event: {obj.get('reason')}: {obj.get('message')}"
        if code == 410:
            raise WatchExpired(message)
        raise KubeApiError(f"{message} (code {code})")
    if kind not in WATCH_EVENT_TYPES:
        raise KubeApiError(f"watch event of unknown type {kind!r}")
    metadata = obj.get("metadata")
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    if not isinstance(version, str) or not version:
        raise KubeApiError(f"{kind} event without metadata.resourceVersion")
    return WatchEvent(kind, obj, version, received)


class KubePodApi:
    """Pods of one namespace matching one label selector, through kubernetes-asyncio's ApiClient."""

    def __init__(self, api_client: Any, namespace: str, selector: str, request_timeout: float = 10.0) -> None:
        from kubernetes_asyncio import client

        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.selector = selector
        self._request_timeout = request_timeout

    @classmethod
    async def connect(
        cls, namespace: str, selector: str, kubeconfig: str | None, request_timeout: float = 10.0
    ) -> KubePodApi:
        """Configure from `kubeconfig`, or from the pod's service account when it is None."""
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if kubeconfig is not None:
                await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
            hint = "" if kubeconfig else " (outside a cluster, pass --kubeconfig PATH)"
            raise KubeApiError(f"cannot configure the Kubernetes client from {where}: {exc}{hint}") from None
        return cls(client.ApiClient(configuration), namespace, selector, request_timeout)

    async def close(self) -> None:
        await self._api_client.close()

    async def list_pods(self) -> PodList:
        what = f"list pods in {self.namespace} ({self.selector})"
        try:
            resp = await self._core.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                _preload_content=False,
                _request_timeout=self._request_timeout,
            )
            try:
                body = await resp.read()
            finally:
                resp.release()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeApiError(f"{what}: {type(exc).__name__}: {exc}") from None
        received = time.monotonic()
        if resp.status != 200:
            raise _status_error(resp.status, body, what)
        try:
            payload = orjson.loads(body)
            items = payload["items"] or []
            version = payload["metadata"]["resourceVersion"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise KubeApiError(f"{what}: not a PodList ({exc!r})") from None
        if not isinstance(items, list) or not isinstance(version, str):
            raise KubeApiError(f"{what}: not a PodList")
        return PodList([i for i in items if isinstance(i, dict)], version, received)

    async def watch_pods(self, resource_version: str, timeout_seconds: int) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version`, until the server ends the stream (after about
        `timeout_seconds`). A stream silent for longer than that plus a margin is broken."""
        what = f"watch pods in {self.namespace} from {resource_version}"
        silence = aiohttp.ClientTimeout(
            total=None, sock_connect=self._request_timeout, sock_read=timeout_seconds + self._request_timeout
        )
        try:
            resp = await self._core.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=silence,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeApiError(f"{what}: {type(exc).__name__}: {exc}") from None
        try:
            if resp.status != 200:
                raise _status_error(resp.status, await resp.read(), what)
            content = resp.content
            buffer = b""
            while True:
                try:
                    chunk = await content.readany()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise KubeApiError(f"{what}: stream broke: {type(exc).__name__}: {exc}") from None
                if not chunk:
                    if buffer.strip():
                        raise KubeApiError(f"{what}: stream ended inside an event")
                    return  # the server ended the watch (timeoutSeconds): a clean end
                # Lines are split here rather than with readline(), which caps a line (a pod) at 128 KiB.
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield parse_watch_line(line, time.monotonic())
        finally:
            resp.close()
