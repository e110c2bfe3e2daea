"""Roles and pairing identities in membership: where an endpoint's role comes from (backends file,
pod label, --prefill/--decode, the supervisor's state), how the supervisor derives its own, and which
decode endpoints a prefill endpoint may be paired with."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from corral.contracts.router import RouterFleet
from corral.contracts.supervisor import StateLine
from corral.engine_state import EngineState
from corral.k8s.watch.client import WatchEvent
from corral.pod_labels import ROLE_LABEL
from corral.router.core_config import parse_roles
from corral.router.discovery.backends_file import BackendsFileError, parse_backends
from corral.router.discovery.engine_identity import static_pairing
from corral.router.discovery.k8s_pods import PodSource, PodSourceConfig, pod_view
from corral.router.discovery.static import StaticSource
from corral.router.membership.consumer import MembershipConsumer
from corral.router.membership.endpoint import Endpoint, SupervisorView
from corral.router.membership.events import EndpointAdded, EndpointRemoved, MembershipEvent
from corral.router.membership.membership import Membership
from corral.router.membership.pairs import model_pairs
from corral.router.telemetry.metrics import RouterMetrics
from corral.supervisor.lifecycle.pd_role import engine_role, kv_transfer_problem
from tests.unit.test_router_endpoint_identity import NS, URL, NoApi, pod

FILE = Path("backends.txt")
CARDS = ({"id": "m", "root": "org/model", "parent": None},)


def test_a_backends_file_line_may_declare_a_role() -> None:
    text = (
        "http://a:1 role=prefill\n"
        "http://b:1=http://b:2 group=g0/1 role=decode\n"
        "http://c:1 role=both group=g1/1\n"
        "http://d:1\n"
    )
    backends = parse_backends(text, FILE)
    assert backends.roles == {"http://a:1": "prefill", "http://b:1": "decode", "http://c:1": "both"}
    assert set(backends.groups) == {"http://b:1", "http://c:1"}
    assert backends.supervisors == {"http://b:1": "http://b:2"}


@pytest.mark.parametrize(
    "line", ["http://a:1 role=prefil", "http://a:1 role=", "http://a:1 role=prefill role=decode"]
)
def test_a_bad_role_in_the_backends_file_is_named_with_its_line(line: str) -> None:
    with pytest.raises(BackendsFileError) as caught:
        parse_backends(f"# fleet\n{line}\n", FILE)
    message = str(caught.value)
    assert message.startswith(f"{FILE}:2: ") and "role=ROLE" in message and "prefill, decode, both" in message


def test_a_pod_label_declares_the_role_and_a_bad_one_keeps_the_pod_out() -> None:
    def pod_with(labels: dict[str, str]) -> dict[str, object]:
        meta = {"namespace": "ns", "name": "p", "uid": "u", "labels": labels}
        status = {
            "podIP": "10.0.0.9",
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        return {"metadata": meta, "status": status}

    assert pod_view(pod_with({ROLE_LABEL: "decode"})).role == "decode"
    assert pod_view(pod_with({})).role is None and pod_view(pod_with({})).blocker() is None
    bad = pod_view(pod_with({ROLE_LABEL: "decoder"}))
    blocked = bad.blocker()
    assert bad.role is None and blocked is not None
    assert blocked[0] == "bad_role" and "'decoder'" in blocked[1] and "prefill, decode, both" in blocked[1]


def test_prefill_and_decode_flags_give_roles_and_one_url_cannot_have_both() -> None:
    roles = parse_roles(("http://a:1/",), ("http://b:1", "http://c:1"))
    assert roles == {"http://a:1": "prefill", "http://b:1": "decode", "http://c:1": "decode"}
    with pytest.raises(click.UsageError, match="--prefill and --decode"):
        parse_roles(("http://a:1",), ("http://a:1/",))
    with pytest.raises(click.UsageError, match="base URL"):
        parse_roles(("a:1",), ())


def test_the_supervisor_derives_its_role_from_the_kv_transfer_config_unless_told() -> None:
    def argv(kv_role: str) -> tuple[str, ...]:
        config = f'{{"kv_connector":"NixlConnector","kv_role":"{kv_role}"}}'
        return ("vllm", "serve", "m", "--kv-transfer-config", config)

    assert engine_role(argv("kv_producer")) == "prefill"
    assert engine_role(argv("kv_consumer")) == "decode"
    assert engine_role(argv("kv_both")) == "both"
    assert engine_role(("vllm", "serve", "m")) == "both"
    assert engine_role(argv("kv_both"), "decode") == "decode"  # --role wins
    assert kv_transfer_problem(argv("kv_producer")) is None
    problem = kv_transfer_problem(("vllm", "serve", "m", "--kv-transfer-config={oops"))
    assert problem is not None and "not JSON" in problem


def test_a_state_line_carries_role_and_pairing_and_an_older_one_has_none() -> None:
    line = StateLine.model_validate({"epoch": 1, "state": "READY", "role": "prefill", "pairing": "abc"})
    assert (line.role, line.pairing) == ("prefill", "abc")
    old = StateLine.model_validate({"epoch": 1, "state": "READY", "role": 3})
    assert (old.role, old.pairing) == (None, None)


def endpoint(m: Membership, url: str, role: str, version: str | None) -> Endpoint:
    e = m.add(Endpoint(url, frozenset({"m"}), EngineState.READY, "test", role=role), "test")
    e.probed_pairing = static_pairing(version, CARDS) if version is not None else None
    return e


def test_a_prefill_engine_on_another_vllm_version_than_every_decode_engine_is_never_paired() -> None:
    m = Membership()
    p_new = endpoint(m, "http://p1", "prefill", "0.34.0")
    d1 = endpoint(m, "http://d1", "decode", "0.33.0")
    endpoint(m, "http://d2", "decode", "0.33.0")
    assert m.eligible_role("m", "prefill", now=0.0) == [p_new]
    assert m.compatible_decode("m", p_new, now=0.0) == []
    [pairs] = RouterFleet.model_validate({"pairs": model_pairs(m, now=0.0)}).pairs
    assert (pairs.prefill_routable, pairs.decode_routable, pairs.pairs) == (1, 2, 0)
    assert pairs.unpaired_prefill == ["http://p1"] and "no routable decode endpoint has it" in pairs.why
    # a decode engine on the prefill's version appears: the prefill pairs with it and only with it
    d3 = endpoint(m, "http://d3", "decode", "0.34.0")
    assert m.compatible_decode("m", p_new, now=0.0) == [d3]
    p_old = endpoint(m, "http://p2", "prefill", "0.33.0")
    assert [e.url for e in m.compatible_decode("m", p_old, now=0.0)] == ["http://d1", "http://d2"]
    assert model_pairs(m, now=0.0)[0]["pairs"] == 3
    # a decode engine that leaves routing is no longer a partner
    m.update(d1.url, "drain", state=EngineState.DRAINING)
    assert [e.url for e in m.compatible_decode("m", p_old, now=0.0)] == ["http://d2"]


def test_an_unknown_pairing_identity_pairs_with_nothing_and_both_takes_either_leg() -> None:
    m = Membership()
    p = endpoint(m, "http://p", "prefill", None)
    either = endpoint(m, "http://x", "both", "0.33.0")
    endpoint(m, "http://d", "decode", "0.33.0")
    assert m.compatible_decode("m", p, now=0.0) == []
    assert model_pairs(m, now=0.0)[0]["unpaired_prefill"] == ["http://p"]
    m.remove(either.url, "gone")
    assert "no known pairing identity" in model_pairs(m, now=0.0)[0]["why"]
    either = endpoint(m, "http://x", "both", "0.33.0")
    assert m.eligible_role("m", "prefill", now=0.0) == [p, either]
    assert [e.url for e in m.compatible_decode("m", either, now=0.0)] == ["http://d"]  # never itself
    only_both = Membership()
    endpoint(only_both, "http://x", "both", "0.33.0")
    assert model_pairs(only_both, now=0.0) == []  # an aggregated model has no pairs to show


def test_the_supervisors_role_and_pairing_win_and_a_mismatch_is_shown() -> None:
    view = SupervisorView("http://sup")
    e = Endpoint("http://e", frozenset({"m"}), EngineState.READY, "test", supervisor=view, role="prefill")
    e.probed_pairing = "probed"
    assert (e.role, e.pairing, e.role_mismatch()) == ("prefill", "probed", None)
    view.role, view.pairing = "decode", "supervised"
    assert (e.role, e.pairing) == ("decode", "supervised")
    mismatch = e.role_mismatch()
    assert mismatch is not None and "declared role prefill but its supervisor says decode" in mismatch
    assert mismatch in e.routing_verdict(0.0)
    undeclared = Endpoint("http://u", supervisor=SupervisorView("http://s2", role="decode"))
    assert undeclared.role == "decode" and undeclared.role_mismatch() is None
    assert Endpoint("http://plain").role == "both"


def test_a_pod_relabelled_with_another_role_is_a_new_endpoint_of_that_role() -> None:

    membership = Membership()
    pods = PodSource(MembershipConsumer(membership), RouterMetrics(), NoApi(), PodSourceConfig())

    def labelled(role: str, version: str) -> dict[str, object]:
        body = pod("vllm-0", uid="uid-a", version=version)
        body["metadata"]["labels"] = {ROLE_LABEL: role}
        return body

    pods.apply(WatchEvent("ADDED", labelled("decode", "1"), "1", 0.0))
    first = membership.get(URL)
    assert first is not None and first.role == "decode"
    pods.apply(WatchEvent("MODIFIED", labelled("decode", "2"), "2", 0.0))
    assert membership.get(URL) is first  # the same label again changes nothing
    pods.apply(WatchEvent("MODIFIED", labelled("prefill", "3"), "3", 0.0))
    second = membership.get(URL)
    assert second is not None and second is not first and second.role == "prefill"
    [exit_record] = membership.exits
    assert (exit_record.cause, exit_record.name) == ("role_changed", f"{NS}/vllm-0")
    assert "decode -> prefill" in exit_record.reason


def test_a_backends_list_whose_role_changes_adds_the_endpoint_again_with_it() -> None:

    events: list[MembershipEvent] = []

    class Sink:
        def emit(self, event: MembershipEvent) -> None:
            events.append(event)

    source = StaticSource(Sink(), ["http://a:1", "http://b:1"], 5.0, roles={"http://a:1": "prefill"})
    assert [(e.url, e.role) for e in events if isinstance(e, EndpointAdded)] == [
        ("http://a:1", "prefill"),
        ("http://b:1", None),
    ]
    events.clear()
    source.set_urls(["http://a:1", "http://b:1"], roles={"http://a:1": "decode"})
    assert [e.identity for e in events if isinstance(e, EndpointRemoved)] == ["http://a:1"]
    assert [(e.url, e.role) for e in events if isinstance(e, EndpointAdded)] == [("http://a:1", "decode")]
