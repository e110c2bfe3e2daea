"""`corral verify`'s `pairs` check, for prefill/decode fleets: the router routes every engine in the
role its supervisor declares, no prefill engine has a pairing identity that no decode engine shares,
and every model served in a role has at least one complete compatible pair the router can route now.
An aggregated fleet (no engine in a prefill or decode role) passes as not applicable.
"""

from __future__ import annotations

from collections import defaultdict

from corral.contracts.router import FleetEndpoint, ModelPairs
from corral.fleet.checks.check import FAIL, NOT_MEASURED, PASS, Check
from corral.fleet.checks.probe import EngineView, FleetView

NAME = "pairs"
SPLIT_ROLES = ("prefill", "decode")
SHOWN = 4  # engines named in one problem, the rest counted


def declared_role(engine: EngineView) -> str | None:
    """prefill | decode | both as the engine's supervisor declares it (None: no supervisor said)."""
    role = (engine.state or {}).get("role")
    return role if isinstance(role, str) else None


def declared_pairing(engine: EngineView) -> str | None:
    pairing = (engine.state or {}).get("pairing")
    return pairing if isinstance(pairing, str) and pairing else None


def serving_group_key(engine: EngineView) -> tuple[str, ...]:
    """What engines must share one bundle fingerprint: the models they serve, and in a P/D fleet their
    role too (a prefill and a decode engine may differ in kv_role and their role's flags by design;
    their pairing identity is what must agree, which the `pairs` check judges)."""
    role = declared_role(engine)
    return (*engine.base_models, *([f"role={role}"] if role in SPLIT_ROLES else []))


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _disagreements(view: FleetView, routed: dict[str, FleetEndpoint]) -> list[str]:
    problems = []
    for e in view.engines:
        role, endpoint = declared_role(e), routed.get(e.engine_url or "")
        if role is not None and endpoint is not None and endpoint.role != role:
            problems.append(
                f"{e.name}: its supervisor declares {role}, the router routes it as {endpoint.role} "
                "(check the router's --prefill/--decode, backends-file role= or the pod's corral.dev/role)"
            )
    return problems


def _unmatched_prefill(view: FleetView) -> list[str]:
    """Prefill engines (as their supervisors declare) whose pairing identity no decode engine serving
    one of their models shares: the router can never pair them."""
    decode: dict[str, set[str]] = defaultdict(set)  # model -> pairing identities of decode engines
    for e in view.engines:
        pairing = declared_pairing(e)
        if declared_role(e) in ("decode", "both") and pairing is not None:
            for model in e.base_models:
                decode[model].add(pairing)
    problems = []
    for e in view.engines:
        if declared_role(e) != "prefill":
            continue
        pairing = declared_pairing(e)
        if pairing is None:
            problems.append(f"prefill {e.name} has no pairing identity yet (its supervisor knows no bundle)")
        elif e.base_models and not any(pairing in decode[m] for m in e.base_models):
            shared = sorted({p for m in e.base_models for p in decode[m]})
            problems.append(
                f"prefill {e.name} has pairing identity {pairing}, which no decode engine of "
                f"{', '.join(e.base_models)} shares ({', '.join(shared) or 'no decode engine'}): their vLLM "
                "version, model or KV layout differ; roll the odd side to the other's bundle"
            )
    return problems


def _routable_pairs(pairs: list[ModelPairs]) -> tuple[list[str], list[str]]:
    """(problems, what passed) from the router's pairs per model."""
    problems, passed = [], []
    for entry in pairs:
        if entry.pairs < 1:
            problems.append(f"{entry.model}: no complete compatible pair is routable ({entry.why})")
        elif entry.unpaired_prefill:
            problems.append(
                f"{entry.model}: routable prefill {_names(entry.unpaired_prefill)} has no compatible "
                "decode engine (requests the router sends it cannot be decoded)"
            )
        else:
            passed.append(
                f"{entry.model}: {entry.prefill_routable} prefill × {entry.decode_routable} decode "
                f"routable, {entry.pairs} compatible pairs"
            )
    return problems, passed


def check_pairs(view: FleetView, require_measured: bool = False) -> Check:
    routed = {ep.url: ep for ep in view.router_endpoints or []}
    roles = [declared_role(e) for e in view.engines] + [ep.role for ep in routed.values()]
    if not any(role in SPLIT_ROLES for role in roles):
        return Check(NAME, PASS, "not applicable: no engine serves in a prefill or decode role (aggregated)")
    problems = _disagreements(view, routed) + _unmatched_prefill(view)
    if view.router_pairs is None:
        why = view.router_error or "no router given"
        if problems:
            return Check(NAME, FAIL, "; ".join(problems) + f"; routable pairs not read: {why}")
        verdict = FAIL if require_measured else NOT_MEASURED
        return Check(NAME, verdict, f"which pairs the router can route is unknown: {why}")
    routable_problems, passed = _routable_pairs(view.router_pairs)
    problems += routable_problems
    if not view.router_pairs:
        problems.append("engines declare prefill/decode roles but the router lists no P/D model in its pairs")
    if problems:
        return Check(NAME, FAIL, "; ".join(problems))
    agreeing = sum(1 for e in view.engines if declared_role(e) is not None and e.engine_url in routed)
    return Check(NAME, PASS, "; ".join(passed) + f"; roles agree for {agreeing} supervised engines")
