"""The fake API server speaks the list/watch wire protocol as kube-apiserver does: PodList with
metadata.resourceVersion, newline-delimited chunked watch events, replay from a version, label
selector transitions, 410 inside the stream, timeoutSeconds and bookmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.fake_kube import FakeKube, parse_selector


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    k = FakeKube()
    await k.start()
    try:
        yield k
    finally:
        await k.stop()


async def get(kube: FakeKube, **params: str) -> tuple[int, str, list[dict[str, Any]]]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(kube.url + "/api/v1/namespaces/ns/pods", params=params) as resp,
    ):
        body = await resp.read()
        if params.get("watch") and resp.status == 200:
            assert resp.headers.get("Transfer-Encoding") == "chunked"
            return resp.status, resp.content_type, [orjson.loads(line) for line in body.splitlines()]
        return resp.status, resp.content_type, [orjson.loads(body)]


def test_label_selectors_in_equality_and_set_forms() -> None:
    labels = {"app": "vllm", "tier": "gpu"}
    for text, want in [
        ("app=vllm", True),
        ("app==vllm,tier=gpu", True),
        ("app!=vllm", False),
        ("tier in (gpu, cpu)", True),
        ("tier notin (gpu)", False),
        ("app", True),
        ("!app", False),
        ("!missing,app in (x,vllm)", True),
        ("", True),
    ]:
        assert parse_selector(text)(labels) is want, text


async def test_list_answers_a_pod_list_at_the_current_version(kube: FakeKube) -> None:
    kube.create_pod("a", "10.0.0.1", "ns", {"app": "vllm"})
    kube.create_pod("b", "10.0.0.2", "ns", {"app": "web"})
    status, ctype, [body] = await get(kube, labelSelector="app=vllm")
    assert (status, ctype, body["kind"]) == (200, "application/json", "PodList")
    assert body["metadata"]["resourceVersion"] == str(kube.version)
    assert [p["metadata"]["name"] for p in body["items"]] == ["a"]
    status, _, [bad] = await get(kube, labelSelector="app in vllm")
    assert status == 400 and bad["kind"] == "Status"


async def test_watch_replays_from_a_version_with_selector_transitions(kube: FakeKube) -> None:
    start = kube.create_pod("a", "10.0.0.1", "ns", {"app": "vllm"})
    kube.update_pod("a", lambda p: p["metadata"]["labels"].update(app="web"), "ns")  # leaves the selector
    kube.update_pod("a", lambda p: p["metadata"]["labels"].update(app="vllm"), "ns")  # comes back
    kube.set_ready("a", False, "ns")
    kube.delete_pod("a", "ns")
    status, _, events = await get(
        kube, watch="1", resourceVersion=str(start), labelSelector="app=vllm", timeoutSeconds="1"
    )
    assert status == 200
    assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[-1] == kube.version
    assert all(e["object"]["kind"] == "Pod" for e in events)


async def test_watch_without_a_version_starts_with_synthetic_adds(kube: FakeKube) -> None:
    kube.create_pod("a", "10.0.0.1", "ns", {"app": "vllm"})
    kube.create_pod("b", "10.0.0.2", "ns", {"app": "vllm"})
    _, _, events = await get(kube, watch="true", timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]


async def test_too_old_version_is_an_error_event_with_a_410_status_or_an_http_410(kube: FakeKube) -> None:
    old = kube.create_pod("a", "10.0.0.1", "ns", {"app": "vllm"})
    kube.create_pod("b", "10.0.0.2", "ns", {"app": "vllm"})
    kube.compact()
    status, _, events = await get(kube, watch="1", resourceVersion=str(old), timeoutSeconds="5")
    assert status == 200 and len(events) == 1
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["kind"] == "Status"
    assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")
    kube.expired_as_http = True
    status, _, [body] = await get(kube, watch="1", resourceVersion=str(old))
    assert status == 410 and body["reason"] == "Expired"


async def test_bookmarks_carry_only_the_version_when_asked_for(kube: FakeKube) -> None:
    kube.bookmark_interval = 0.2
    v = kube.create_pod("a", "10.0.0.1", "ns", {"app": "vllm"})
    _, _, events = await get(
        kube, watch="1", resourceVersion=str(v), timeoutSeconds="1", allowWatchBookmarks="true"
    )
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"]["metadata"] == {"resourceVersion": str(v)}
    _, _, events = await get(kube, watch="1", resourceVersion=str(v), timeoutSeconds="1")
    assert events == []
