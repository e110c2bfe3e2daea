"""Roles and pairs in a real router's /v1/fleet: `corral router --prefill A --decode B --decode C` in
front of `corral sim` engines on different vLLM versions (their /version) pairs the prefill engine only
with the decode engine on its version, and says why there is no pair once that one is gone; a
supervised sim run with a kv_producer `--kv-transfer-config` publishes role prefill and its pairing
identity, which the router takes over the role it was told. Real processes on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from corral.contracts.router import ModelPairs, RouterFleet
from tests.integration.test_supervisor_support import http_json, supervised
from tests.support.procs import CorralProcess, free_port, start_sim
from tests.support.waits import wait_until

MODEL = "sim-model"


def kv_config(kv_role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})


def start_router(*flags: str) -> tuple[CorralProcess, str]:
    port = free_port()
    proc = CorralProcess(
        ["router", "--host", "127.0.0.1", "--port", str(port), "--models-refresh-seconds", "0.3", *flags]
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/livez")
    return proc, url


def fleet(url: str) -> RouterFleet:
    return RouterFleet.from_body(http_json(url + "/v1/fleet")[1])


def pairs_of(url: str) -> ModelPairs:
    [pairs] = fleet(url).pairs
    assert pairs.model == MODEL
    return pairs


@pytest.fixture
def engines() -> Iterator[dict[str, tuple[CorralProcess, str]]]:
    started: dict[str, tuple[CorralProcess, str]] = {}
    try:
        for name, kv_role, version in (
            ("prefill", "kv_producer", "0.34.0"),
            ("decode_old", "kv_consumer", "0.33.0"),
            ("decode_new", "kv_consumer", "0.34.0"),
        ):
            started[name] = start_sim(
                None,
                *("--kv-transfer-config", kv_config(kv_role), "--version-string", version),
                model=MODEL,
                wait=False,  # the three start together
            )
        for proc, url in started.values():
            proc.wait_http(url + "/health")
        yield started
    finally:
        for proc, _ in started.values():
            proc.stop()


def test_the_router_pairs_a_prefill_engine_only_with_a_decode_engine_on_its_vllm_version(
    engines: dict[str, tuple[CorralProcess, str]],
) -> None:
    prefill, old, new = (engines[n][1] for n in ("prefill", "decode_old", "decode_new"))
    router, url = start_router("--prefill", prefill, "--decode", old, "--decode", new)
    try:
        wait_until(lambda: all(e.routable for e in fleet(url).endpoints), 20, "three routable endpoints")
        by_url = fleet(url).by_url()
        assert {u: e.role for u, e in by_url.items()} == {prefill: "prefill", old: "decode", new: "decode"}
        assert by_url[prefill].pairing is not None
        assert by_url[prefill].pairing == by_url[new].pairing != by_url[old].pairing
        pairs = pairs_of(url)
        assert (pairs.prefill_routable, pairs.decode_routable, pairs.pairs) == (1, 2, 1)
        assert pairs.unpaired_prefill == [] and pairs.why.startswith("routable: 1 ")

        engines["decode_new"][0].stop()  # the only decode engine on the prefill's version goes
        wait_until(lambda: not fleet(url).by_url()[new].routable, 20, "the stopped decode engine unroutable")
        pairs = pairs_of(url)
        assert (pairs.prefill_routable, pairs.decode_routable, pairs.pairs) == (1, 1, 0)
        assert pairs.unpaired_prefill == [prefill]
        assert f"prefill {prefill} has pairing identity {by_url[prefill].pairing}" in pairs.why
        assert f"{old}={by_url[old].pairing}" in pairs.why, pairs.why
    finally:
        router.stop()


def test_a_supervised_kv_producer_publishes_role_prefill_and_the_router_takes_its_word() -> None:
    engine_port = free_port()
    sim_args = ("--kv-transfer-config", kv_config("kv_producer"))
    with supervised(sim_args=sim_args, engine_port=engine_port) as sup:
        state: dict[str, Any] = sup.wait_state("READY", 60)
        assert state["role"] == "prefill" and isinstance(state["pairing"], str), state
        assert state["connector"] == "NixlConnector", state
        # declared a decode engine, but its supervisor says prefill: the supervisor's word wins
        router, url = start_router("--decode", sup.engine_url, "--supervised", f"{sup.engine_url}={sup.url}")
        try:
            wait_until(lambda: fleet(url).endpoints[0].routable, 20, "the supervised endpoint routable")
            [endpoint] = fleet(url).endpoints
            assert (endpoint.role, endpoint.pairing) == ("prefill", state["pairing"])
            assert endpoint.supervisor is not None and endpoint.supervisor.connector == "NixlConnector"
            assert "declared role decode but its supervisor says prefill" in endpoint.why, endpoint.why
            pairs = pairs_of(url)
            assert (pairs.prefill_routable, pairs.decode_routable, pairs.pairs) == (1, 0, 0)
            assert pairs.why == f"no routable decode endpoint serves {MODEL}"
        finally:
            router.stop()
