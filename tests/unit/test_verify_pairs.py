"""`corral verify`'s `pairs` check: not applicable (pass) on an aggregated fleet; on a P/D fleet it fails
when the router and a supervisor disagree on a role, when a prefill engine's pairing identity matches
no decode engine (named), or when a model has no routable compatible pair; the bundle check groups
prefill and decode engines apart."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contracts.router import FleetEndpoint, ModelPairs
from corral.fleet.checks.check import FAIL, NOT_MEASURED, PASS
from corral.fleet.checks.pairs import check_pairs
from corral.fleet.checks.probe import EngineView, FleetTarget, FleetView
from corral.fleet.checks.verify import check_bundle

MODEL = "llama"


def engine(name: str, role: str | None, pairing: str | None = "aaaa", fingerprint: str = "f0") -> EngineView:
    state: dict[str, Any] = {"state": "READY", "bundle": {"fingerprint": fingerprint}}
    if role is not None:
        state |= {"role": role, "pairing": pairing}
    return EngineView(
        name, f"http://{name}-sup", f"http://{name}", state=state, models=[{"id": MODEL}], health=200
    )


def routed(e: EngineView, role: str) -> FleetEndpoint:
    assert e.engine_url is not None
    return FleetEndpoint(url=e.engine_url, name=e.name, routable=True, role=role, models=[MODEL])


def fleet(
    engines: list[EngineView],
    roles: dict[str, str] | None = None,
    pairs: list[ModelPairs] | None = None,
    router: bool = True,
) -> FleetView:
    view = FleetView(FleetTarget("http://router" if router else None, []), engines)
    if router:
        roles = roles or {}
        view.router_endpoints = [routed(e, roles.get(e.name, declared(e))) for e in engines]
        view.router_pairs = pairs or []
    return view


def declared(e: EngineView) -> str:
    return str((e.state or {}).get("role") or "both")


def healthy_pairs(prefill: int = 1, decode: int = 1) -> list[ModelPairs]:
    return [
        ModelPairs(
            model=MODEL,
            prefill_routable=prefill,
            decode_routable=decode,
            pairs=prefill * decode,
            why="routable",
        )
    ]


def test_aggregated_fleet_is_not_applicable_and_passes() -> None:
    check = check_pairs(fleet([engine("e0", "both"), engine("e1", None)]))
    assert check.verdict == PASS
    assert "not applicable" in check.detail


def test_a_coherent_fleet_passes_with_its_pairs() -> None:
    view = fleet([engine("p0", "prefill"), engine("d0", "decode")], pairs=healthy_pairs())
    check = check_pairs(view)
    assert check.verdict == PASS, check.detail
    assert "1 prefill × 1 decode routable, 1 compatible pairs" in check.detail


def test_router_and_supervisor_disagreeing_on_a_role_fails_naming_the_engine() -> None:
    view = fleet(
        [engine("p0", "prefill"), engine("d0", "decode")], roles={"d0": "prefill"}, pairs=healthy_pairs()
    )
    check = check_pairs(view)
    assert check.verdict == FAIL
    assert "d0: its supervisor declares decode, the router routes it as prefill" in check.detail


def test_a_prefill_engine_whose_pairing_no_decode_shares_is_named() -> None:
    engines = [
        engine("p0", "prefill", "aaaa"),
        engine("p1", "prefill", "bbbb"),  # another vLLM version than every decode engine
        engine("d0", "decode", "aaaa"),
    ]
    check = check_pairs(fleet(engines, pairs=healthy_pairs(2, 1)))
    assert check.verdict == FAIL
    assert (
        "prefill p1 has pairing identity bbbb, which no decode engine of llama shares (aaaa)" in check.detail
    )
    assert "p0" not in check.detail


def test_a_both_engine_pairs_with_a_prefill_engine() -> None:
    engines = [engine("p0", "prefill", "aaaa"), engine("b0", "both", "aaaa")]
    check = check_pairs(fleet(engines, pairs=healthy_pairs()))
    assert check.verdict == PASS, check.detail


def test_a_prefill_engine_without_a_pairing_identity_fails() -> None:
    engines = [engine("p0", "prefill", None), engine("d0", "decode")]
    check = check_pairs(fleet(engines, pairs=healthy_pairs()))
    assert check.verdict == FAIL
    assert "prefill p0 has no pairing identity yet" in check.detail


def test_no_routable_pair_fails_with_the_routers_reason() -> None:
    why = "no routable decode endpoint serves llama"
    pairs = [ModelPairs(model=MODEL, prefill_routable=1, decode_routable=0, pairs=0, why=why)]
    check = check_pairs(fleet([engine("p0", "prefill"), engine("d0", "decode")], pairs=pairs))
    assert check.verdict == FAIL
    assert f"llama: no complete compatible pair is routable ({why})" in check.detail


def test_a_routable_prefill_without_a_decode_partner_fails() -> None:
    pairs = [
        ModelPairs(
            model=MODEL,
            prefill_routable=2,
            decode_routable=1,
            pairs=1,
            unpaired_prefill=["p1"],
            why="routable",
        )
    ]
    engines = [engine("p0", "prefill"), engine("p1", "prefill"), engine("d0", "decode")]
    check = check_pairs(fleet(engines, pairs=pairs))
    assert check.verdict == FAIL
    assert "routable prefill p1 has no compatible decode engine" in check.detail


def test_router_listing_no_pd_model_fails() -> None:
    check = check_pairs(fleet([engine("p0", "prefill"), engine("d0", "decode")], pairs=[]))
    assert check.verdict == FAIL
    assert "router lists no P/D model" in check.detail


@pytest.mark.parametrize(("require", "verdict"), [(False, NOT_MEASURED), (True, FAIL)])
def test_without_a_router_routable_pairs_are_not_measured(require: bool, verdict: str) -> None:
    view = fleet([engine("p0", "prefill"), engine("d0", "decode")], router=False)
    check = check_pairs(view, require_measured=require)
    assert check.verdict == verdict
    assert "no router given" in check.detail


def test_without_a_router_an_unmatched_prefill_still_fails() -> None:
    view = fleet([engine("p0", "prefill", "bbbb"), engine("d0", "decode", "aaaa")], router=False)
    assert check_pairs(view).verdict == FAIL


def test_bundle_check_groups_prefill_and_decode_apart() -> None:
    # prefill and decode engines differ in kv_role (and their role's flags), so in fingerprint
    engines = [
        engine("p0", "prefill", fingerprint="f-prefill"),
        engine("p1", "prefill", fingerprint="f-prefill"),
        engine("d0", "decode", fingerprint="f-decode"),
    ]
    assert check_bundle(fleet(engines)).verdict == PASS
    engines.append(engine("d1", "decode", fingerprint="f-other"))
    check = check_bundle(fleet(engines))
    assert check.verdict == FAIL
    assert "role=decode" in check.detail
