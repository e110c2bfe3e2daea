"""A Kubernetes API server for tests, pods only: `GET /api/v1/namespaces/{ns}/pods`, list and
`?watch=1`, as kube-apiserver answers on the wire — and test controls to change pods and to
misbehave the way a real control plane can (delayed, dropped or cut events, expired history).

Wire behaviour kept faithful:
- one global resourceVersion counter; every change bumps it and stamps the object's
  `metadata.resourceVersion`; a list answers `kind: PodList` with `metadata.resourceVersion`;
- a watch is a chunked `application/json` stream of one JSON event per line:
  `{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": {...}}`;
- watch without resourceVersion (or "0") starts with synthetic ADDED events for the current pods;
  watch from version N replays every later change, then goes live;
- N older than the compacted history: HTTP 200 and one ERROR event carrying a `Status` with code
  410 / reason `Expired` (what a real server does inside the stream), or an HTTP 410 `Status`
  when `expired_as_http` is set;
- labelSelector in the equality (`k=v`, `k==v`, `k!=v`) and set-based (`k in (a,b)`,
  `k notin (a,b)`, `k`, `!k`) forms; a pod whose labels stop matching is DELETED for that watch,
  one that starts to match is ADDED;
- timeoutSeconds ends the stream cleanly; allowWatchBookmarks sends BOOKMARK events (an object of
  the watched kind carrying only `metadata.resourceVersion`) when the stream is idle;
- booleans in the query are parsed as Go's strconv.ParseBool does (1, t, true, True, ...).

Not modelled: other resources, field selectors, paging (`limit` is ignored and the whole list
returned, which a real server may also do), authentication, server-side apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web

T = TypeVar("T")
Pod = dict[str, Any]
TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
FIRST_VERSION = 1000


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# -- label selectors --------------------------------------------------------------------------

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")

Matcher = Callable[[dict[str, str]], bool]


class SelectorError(ValueError):
    pass


def parse_selector(text: str) -> Matcher:
    """A label selector as the API server parses it (the forms listed in the module docstring)."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    tests: list[Matcher] = []
    for part in parts:
        if not part.strip():
            if text.strip():
                raise SelectorError(f"empty requirement in {text!r}")
            continue
        if m := _SET_RE.match(part):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := _EQ_RE.match(part):
            key, op, value = m.group(1), m.group(2), m.group(3)
            if op == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := _EXISTS_RE.match(part):
            negate, key = m.group(1) == "!", m.group(2)
            tests.append(lambda labels, k=key, n=negate: (k in labels) != n)
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")
    return lambda labels: all(t(labels) for t in tests)


def labels_of(pod: Pod) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})


# -- server state -----------------------------------------------------------------------------


@dataclass(slots=True)
class Change:
    version: int
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED as committed
    before: Pod | None
    after: Pod
    dropped: bool = False  # never delivered nor replayed (a lost event, for reconcile tests)


@dataclass(eq=False, slots=True)
class Watch:
    namespace: str
    match: Matcher
    request: web.Request
    queue: asyncio.Queue[tuple[float, bytes] | None] = field(default_factory=asyncio.Queue)


def event_for(change: Change, match: Matcher) -> tuple[str, Pod] | None:
    """What one watcher with `match` sees of `change` (selector transitions included)."""
    new = match(labels_of(change.after))
    old = change.before is not None and match(labels_of(change.before))
    if change.type == "DELETED":
        return ("DELETED", change.after) if old or new else None
    if change.type == "ADDED":
        return ("ADDED", change.after) if new else None
    if old and new:
        return ("MODIFIED", change.after)
    if new:
        return ("ADDED", change.after)
    if old:
        return ("DELETED", change.after)
    return None


def event_line(kind: str, obj: Pod) -> bytes:
    return orjson.dumps({"type": kind, "object": {"kind": "Pod", "apiVersion": "v1", **obj}}) + b"\n"


class FakeKube:
    """The API server state and its HTTP app; every method runs on the server's event loop."""

    def __init__(self) -> None:
        self.version = FIRST_VERSION
        self.pods: dict[tuple[str, str], Pod] = {}
        self.history: list[Change] = []
        self.compacted = FIRST_VERSION  # watching from an older version answers 410
        self.committed_at: dict[int, float] = {}  # version -> time.monotonic() of the change
        self.watches: set[Watch] = set()
        self.requests: list[tuple[str, dict[str, str]]] = []  # ("list"|"watch", query)
        # knobs
        self.event_delay = 0.0
        self.bookmark_interval = 1.0
        self.default_watch_timeout = 1800
        self.expired_as_http = False
        self.unavailable = False  # answer 503 to lists and watches (an API server outage)
        self._drop_rules: list[Callable[[str, Pod], bool]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- serving ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        self.url = f"http://{host}:{sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        self.cut_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            "users:\n- name: tester\n  user: {}\n"
            f"contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n"
            f"    namespace: {namespace}\n"
            "current-context: fake\n"
        )
        return path

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        query = dict(request.query)
        watching = query.get("watch", "false")
        if watching not in TRUE | FALSE:
            return self._status(400, "BadRequest", f"invalid watch value {watching!r}")
        self.requests.append(("watch" if watching in TRUE else "list", query))
        if self.unavailable:
            return self._status(
                503, "ServiceUnavailable", "the server is currently unable to handle the request"
            )
        try:
            match = parse_selector(query.get("labelSelector", ""))
        except SelectorError as exc:
            return self._status(400, "BadRequest", str(exc))
        if watching in TRUE:
            return await self._watch(request, namespace, match, query)
        items = [
            pod for (ns, _), pod in sorted(self.pods.items()) if ns == namespace and match(labels_of(pod))
        ]
        body = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.version)},
            "items": items,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    def _status(self, code: int, reason: str, message: str) -> web.Response:
        return web.Response(
            status=code, body=orjson.dumps(status(code, reason, message)), content_type="application/json"
        )

    async def _watch(
        self, request: web.Request, namespace: str, match: Matcher, query: dict[str, str]
    ) -> web.StreamResponse:
        since = query.get("resourceVersion", "")
        try:
            timeout = int(query.get("timeoutSeconds", self.default_watch_timeout))
            start_version = int(since) if since not in ("", "0") else None
        except ValueError:
            return self._status(400, "BadRequest", "resourceVersion and timeoutSeconds must be integers")
        bookmarks = query.get("allowWatchBookmarks", "false") in TRUE
        expired = start_version is not None and start_version < self.compacted
        if expired and self.expired_as_http:
            return self._status(
                410, "Expired", f"too old resource version: {start_version} ({self.compacted})"
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if expired:
            line = orjson.dumps(
                {
                    "type": "ERROR",
                    "object": status(
                        410, "Expired", f"too old resource version: {start_version} ({self.compacted})"
                    ),
                }
            )
            await response.write(line + b"\n")
            await response.write_eof()
            return response

        # Replay and registration happen in one step, so no change falls between them.
        watch = Watch(namespace, match, request)
        now = time.monotonic()
        if start_version is None:
            for (ns, _), pod in sorted(self.pods.items()):
                if ns == namespace and match(labels_of(pod)):
                    watch.queue.put_nowait((now, event_line("ADDED", pod)))
        else:
            for change in self.history:
                if change.version > start_version and change.namespace == namespace and not change.dropped:
                    seen = event_for(change, match)
                    if seen is not None:
                        watch.queue.put_nowait((now, event_line(*seen)))
        self.watches.add(watch)
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval) if bookmarks else remaining
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and watch.queue.empty() and time.monotonic() < deadline:
                        bookmark = {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": "Pod",
                                "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(self.version)},
                            },
                        }
                        await response.write(orjson.dumps(bookmark) + b"\n")
                    continue
                if item is None:  # expire_watches(): the server ends it with a 410 ERROR
                    expiry = status(410, "Expired", f"too old resource version ({self.compacted})")
                    await response.write(orjson.dumps({"type": "ERROR", "object": expiry}) + b"\n")
                    break
                due, line = item
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await response.write(line)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.watches.discard(watch)
        return response

    # -- changes ------------------------------------------------------------------------------

    def _commit(self, namespace: str, kind: str, before: Pod | None, after: Pod) -> int:
        self.version += 1
        after["metadata"]["resourceVersion"] = str(self.version)
        name = after["metadata"]["name"]
        dropped = any(rule(kind, after) for rule in self._drop_rules)
        change = Change(self.version, namespace, kind, before, after, dropped)
        self.history.append(change)
        self.committed_at[self.version] = time.monotonic()
        if kind == "DELETED":
            self.pods.pop((namespace, name), None)
        else:
            self.pods[(namespace, name)] = after
        if not dropped:
            due = time.monotonic() + self.event_delay
            for watch in list(self.watches):
                if watch.namespace == namespace:
                    seen = event_for(change, watch.match)
                    if seen is not None:
                        watch.queue.put_nowait((due, event_line(*seen)))
        return self.version

    def _copy(self, namespace: str, name: str) -> tuple[Pod, Pod]:
        before = self.pods[(namespace, name)]
        return before, orjson.loads(orjson.dumps(before))

    def create_pod(
        self,
        name: str,
        ip: str | None,
        namespace: str = "default",
        labels: dict[str, str] | None = None,
        ready: bool = True,
        port: int = 8000,
    ) -> int:
        if (namespace, name) in self.pods:
            raise ValueError(f"pod {namespace}/{name} already exists")
        pod: Pod = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "labels": dict(labels or {}),
            },
            "spec": {
                "containers": [
                    {"name": "vllm", "image": "vllm/vllm-openai", "ports": [{"containerPort": port}]}
                ]
            },
            "status": {"phase": "Pending", "conditions": []},
        }
        _set_status(pod, ip, ready)
        return self._commit(namespace, "ADDED", None, pod)

    def update_pod(self, name: str, change: Callable[[Pod], None], namespace: str = "default") -> int:
        before, after = self._copy(namespace, name)
        change(after)
        return self._commit(namespace, "MODIFIED", before, after)

    def set_ready(self, name: str, ready: bool, namespace: str = "default") -> int:
        return self.update_pod(name, lambda p: _set_status(p, p["status"].get("podIP"), ready), namespace)

    def evict(self, name: str, namespace: str = "default") -> int:
        """What the kubelet writes for an evicted pod: Failed, reason Evicted, no IP, not Ready."""

        def evicted(pod: Pod) -> None:
            pod["status"] = {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
                "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed"}],
            }

        return self.update_pod(name, evicted, namespace)

    def mark_terminating(self, name: str, namespace: str = "default") -> int:
        def terminating(pod: Pod) -> None:
            pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            pod["metadata"]["deletionGracePeriodSeconds"] = 30

        return self.update_pod(name, terminating, namespace)

    def delete_pod(self, name: str, namespace: str = "default") -> int:
        before, after = self._copy(namespace, name)
        return self._commit(namespace, "DELETED", before, after)

    # -- misbehaviour -------------------------------------------------------------------------

    def drop_events(self, rule: Callable[[str, Pod], bool]) -> None:
        """Changes matching `rule(type, pod)` are applied but never sent nor replayed."""
        self._drop_rules.append(rule)

    def stop_dropping(self) -> None:
        self._drop_rules.clear()

    def cut_watches(self) -> int:
        """Drop every open watch connection without a clean end; returns how many."""
        cut = 0
        for watch in list(self.watches):
            transport = watch.request.transport
            if transport is not None:
                transport.abort()
                cut += 1
            self.watches.discard(watch)
        return cut

    def expire_watches(self) -> int:
        """Forget all history and end every open watch with an ERROR 410 event."""
        self.compact()
        for watch in self.watches:
            watch.queue.put_nowait(None)
        return len(self.watches)

    def compact(self) -> None:
        """Forget the history up to now: watching from any older version answers 410."""
        self.compacted = self.version
        self.history.clear()


def _set_status(pod: Pod, ip: str | None, ready: bool) -> None:
    st = pod["status"]
    st["phase"] = "Running" if ip else "Pending"
    if ip:
        st["podIP"] = ip
        st["podIPs"] = [{"ip": ip}]
    else:
        st.pop("podIP", None)
        st.pop("podIPs", None)
    flag = "True" if ready else "False"
    st["conditions"] = [
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": flag},
        {"type": "ContainersReady", "status": flag},
        {"type": "PodScheduled", "status": "True"},
    ]


class FakeKubeThread:
    """A FakeKube on its own event loop in a daemon thread, so that a test's own load never delays
    the API server; `call(fn)` runs `fn(kube)` on that loop and returns its result."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-kube", daemon=True)
        self.url = ""

    def __enter__(self) -> FakeKubeThread:
        self._thread.start()
        self.url = self._run(self.kube.start())
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self._run(self.kube.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def call(self, fn: Callable[[FakeKube], T]) -> T:
        async def run() -> T:
            return fn(self.kube)

        return self._run(run())
