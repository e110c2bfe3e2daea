"""Where a router reaches an engine's KV events, from the engine's command (what its supervisor
publishes) or from a `PUB[,REPLAY]` text (backends file, pod annotation)."""

from __future__ import annotations

import pytest

from corral.engine.kv_events_address import KvEventsAddress, address_from_argv, parse_address

CONFIG = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'


def test_the_engines_wildcard_bind_becomes_its_host() -> None:
    argv = ["vllm", "serve", "m", "--kv-events-config", CONFIG]
    address = address_from_argv(argv, "http://10.0.0.7:8000")
    assert address == KvEventsAddress("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")
    assert address.to_text() == "tcp://10.0.0.7:5557,tcp://10.0.0.7:5558"
    assert address_from_argv([f"--kv-events-config={CONFIG}"], "http://h:1") == KvEventsAddress(
        "tcp://h:5557", "tcp://h:5558"
    )


def test_an_engine_that_publishes_nothing_has_no_address() -> None:
    assert address_from_argv(["vllm", "serve", "m"], "http://h:1") is None
    off = '{"enable_kv_cache_events": false}'
    assert address_from_argv(["--kv-events-config", off], "http://h:1") is None
    assert address_from_argv(["--kv-events-config", "{nope"], "http://h:1") is None  # the engine refuses it


def test_written_addresses() -> None:
    assert parse_address("tcp://*:5557", "h") == KvEventsAddress("tcp://h:5557")
    assert parse_address("tcp://10.1.1.1:5557", "h").endpoint == "tcp://10.1.1.1:5557"
    assert parse_address("ipc:///tmp/kv", "h").endpoint == "ipc:///tmp/kv"
    for bad in ("", "tcp://*:5557,", "a,b,c"):
        with pytest.raises(ValueError, match="KV events address"):
            parse_address(bad, "h")


def test_an_engine_whose_publisher_connects_out_has_no_address_to_subscribe_to() -> None:
    # vLLM binds only a wildcard, ipc or inproc endpoint; at any other tcp address its PUB connects out
    config = '{"enable_kv_cache_events": true, "endpoint": "tcp://10.0.0.1:5557"}'
    assert address_from_argv(["--kv-events-config", config], "http://10.0.0.7:8000") is None


@pytest.mark.parametrize(
    "engine_url", ["http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"]
)
def test_an_engine_on_loopback_keeps_its_wildcard_for_the_subscriber_to_map(engine_url: str) -> None:
    # a rendered pod's engine listens on 127.0.0.1 behind the gate; a router in another pod maps the
    # wildcard to the pod IP it reached, where 127.0.0.1 would be its own host
    argv = ["vllm", "serve", "m", "--kv-events-config", CONFIG]
    address = address_from_argv(argv, engine_url)
    assert address == KvEventsAddress("tcp://*:5557", "tcp://*:5558")
    assert parse_address(address.to_text(), "10.0.0.9") == KvEventsAddress(
        "tcp://10.0.0.9:5557", "tcp://10.0.0.9:5558"
    )
