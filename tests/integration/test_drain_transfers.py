"""A drain never strands a KV transfer: a supervised prefill `corral sim` holding two transfers (prefill
legs sent by hand, as a P/D proxy sends them) is drained through `POST /v1/drain`. A decode `corral sim`
pulls one during the drain; nobody pulls the other, so the drain waits until the engine's lease (shortened
with kv_lease_duration) expires it: the report says `pulled: 1, timed_out: 1`, and the engine is stopped
only after both."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from corral.engine.pd_protocol import decode_leg_body, prefill_leg_body, transfer_params_of
from tests.integration.test_supervisor_support import Supervised, http_json, supervised
from tests.support.procs import start_sim

BODY = {"model": "sim-model", "prompt": "a prompt", "max_tokens": 4}
LEASE_S = 6  # long enough to pull one transfer during the drain, short for the other to expire
DRAIN_ARGS = ("--propagation-timeout", "2", "--quiet-period", "0.3", "--drain-timeout", "30")


def kv_config(role: str, lease: float) -> str:
    return json.dumps(
        {
            "kv_connector": "NixlConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"kv_lease_duration": lease},
        }
    )


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def held(engine_url: str) -> float:
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("corral_sim_kv_transfers_held")
    )


def hold(prefill: Supervised, prompt: str) -> dict[str, Any]:
    """A prefill leg by hand: the engine answers with the params a decode engine needs, holding the blocks."""
    body = {**BODY, "prompt": prompt}
    params = transfer_params_of(post(prefill.engine_url + "/v1/completions", prefill_leg_body(body)))
    assert params is not None and params["do_remote_prefill"] is True
    return params


def test_a_drain_waits_for_one_transfer_pulled_and_one_expired_then_stops_the_engine() -> None:
    decode, decode_url = start_sim(None, "--kv-transfer-config", kv_config("kv_consumer", 30), wait=False)
    sim_args = ("--kv-transfer-config", kv_config("kv_producer", LEASE_S))
    try:
        with supervised(sim_args=sim_args, sup_args=DRAIN_ARGS) as prefill:
            decode.wait_http(decode_url + "/health")
            prefill.wait_state("READY", 60)
            pulled = hold(prefill, "the prompt whose blocks the decode engine pulls during the drain")
            hold(prefill, "the prompt whose blocks nobody pulls")
            assert held(prefill.engine_url) == 2
            status, _ = http_json(prefill.url + "/v1/drain", "POST", {})
            assert status in (200, 202), status
            prefill.wait_for("waiting for transfers", lambda b: b.get("sub_state") == "waiting_transfers", 20)
            answer = post(decode_url + "/v1/completions", decode_leg_body(BODY, pulled))
            assert answer["choices"][0]["text"], answer  # the decode engine pulled the blocks and went on
            pulled_at = time.time()

            body = prefill.wait_for("drained", lambda b: b.get("drain") is not None, 40)
            report = body["drain"]
            transfers = report["transfers"]
            assert transfers is not None, report
            assert transfers["role"] == "prefill" and transfers["bound"] == "lease"
            assert (transfers["held_at_start"], transfers["pulled"], transfers["timed_out"]) == (2, 1, 1), (
                transfers
            )
            assert transfers["held_at_end"] == 0 and transfers["ended"] == "clear"
            assert transfers["source"]["held"] == "corral_sim_kv_transfers_held"
            # the engine was stopped only after: after the pull, and after the expiry the wait saw
            transitions = prefill.transitions()
            subs = [t.get("sub_state") for t in transitions]
            assert subs.index("waiting_transfers") < subs.index("stopping_engine"), subs
            stopping = transitions[subs.index("stopping_engine")]
            assert stopping["time"] > pulled_at
            assert report["engine_exit_code"] is not None
            record = next(r for r in reversed(prefill.oplog()) if r["record"] == "change_record")
            (step,) = [s for s in record["steps"] if s["step"] == "wait_transfers"]
            assert step["ok"] and step["data"]["pulled"] == 1 and step["data"]["timed_out"] == 1
    finally:
        decode.stop()
