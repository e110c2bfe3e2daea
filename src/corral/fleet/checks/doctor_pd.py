"""`corral doctor`'s prefill/decode branch: no compatible pair (the router's `/v1/fleet` pairs), KV
transfers failing or expiring (each engine's `vllm:nixl_*` counters rising between two readings), and
stranded blocks (a prefill engine's held transfers not falling while no decode engine of its model is
routable), each with its evidence and the command to run next.
"""

from __future__ import annotations

import asyncio

import aiohttp

from corral.engine.metric_names import NIXL_FAILED_TRANSFERS, NIXL_KV_EXPIRED_REQS, SIM_KV_TRANSFERS_HELD
from corral.engine.metrics_text import samples
from corral.fleet.checks.pairs import SPLIT_ROLES, declared_role
from corral.fleet.checks.probe import EngineView, FleetView

NO_PAIR = "pd/no-compatible-pair"
UNPAIRED_PREFILL = "pd/prefill-without-partner"
TRANSFER_FAILURES = "pd/transfer-failures"
EXPIRED_TRANSFERS = "pd/expired-transfers"
STRANDED_BLOCKS = "pd/stranded-blocks"

Finding = tuple[str, str, str, str]  # member, branch, evidence, next command

_PAIRS_NEXT = (
    "`corral verify` (check pairs) names the engines whose pairing identity matches no other side; roll "
    "the odd side to the other's bundle (corral rollout), or start an engine of the missing role"
)
_FAILED_NEXT = (
    "the decode engine could not pull from the prefill engine: check NIXL's side channel between them "
    "(VLLM_NIXL_SIDE_CHANNEL_HOST must be the prefill pod's IP, its port open between engine pods, as "
    "`corral k8s render`'s NetworkPolicy does) and both engines' logs: "
    "corral logs --engine NAME (a local fleet), else corral status --supervisor URL --json"
)
_EXPIRED_NEXT = (
    "blocks held for a decode engine were freed unpulled after kv_lease_duration: the decode side is "
    "slow, unreachable or gone (corral status; the router's decode legs in its /metrics); raise "
    "kv_connector_extra_config.kv_lease_duration only when decodes are healthy but slow"
)
_STRANDED_NEXT = (
    "bring a decode engine of the model back (corral status; corral wake, or restart it); the prefill "
    "engine frees the blocks after kv_lease_duration (counted in vllm:nixl_num_kv_expired_reqs), and a "
    "drain of it waits for that"
)


def metric_total(text: str | None, name: str) -> float | None:
    """The sum of `name` over its label sets in an engine's /metrics text (None: not shown)."""
    if not text:
        return None
    found = [s.value for s in samples(text, (name,))]
    return sum(found) if found else None


def role_of(engine: EngineView, view: FleetView) -> str:
    """The engine's role: its supervisor's word, else the router's, else both."""
    declared = declared_role(engine)
    if declared is not None:
        return declared
    routed = next((ep for ep in view.router_endpoints or [] if ep.url == engine.engine_url), None)
    return routed.role if routed is not None else "both"


def is_disaggregated(view: FleetView) -> bool:
    roles = [role_of(e, view) for e in view.engines] + [ep.role for ep in view.router_endpoints or []]
    return any(role in SPLIT_ROLES for role in roles)


def _pairs(view: FleetView) -> list[Finding]:
    found: list[Finding] = []
    for entry in view.router_pairs or []:
        if entry.pairs < 1:
            evidence = (
                f"{entry.model}: {entry.prefill_routable} prefill and {entry.decode_routable} decode "
                f"endpoints routable, no compatible pair: {entry.why}"
            )
            found.append(("router", NO_PAIR, evidence, _PAIRS_NEXT))
        elif entry.unpaired_prefill:
            evidence = (
                f"{entry.model}: routable prefill {', '.join(entry.unpaired_prefill)} has no compatible "
                f"decode endpoint ({entry.pairs} pairs among the others)"
            )
            found.append(("router", UNPAIRED_PREFILL, evidence, _PAIRS_NEXT))
    return found


def _rising(e: EngineView, later: str | None, name: str, seconds: float) -> str | None:
    before, after = metric_total(e.metrics, name), metric_total(later, name)
    if before is None or after is None or after <= before:
        return None
    return f"{name} {before:g} → {after:g} within {seconds:g}s"


def _decode_routable(view: FleetView, models: list[str]) -> bool:
    """Whether any routable decode (or both) endpoint serves one of `models`, per the router."""
    for entry in view.router_pairs or []:
        if entry.model in models:
            return entry.decode_routable > 0
    return any(
        ep.routable and ep.role in ("decode", "both") and set(ep.models) & set(models)
        for ep in view.router_endpoints or []
    )


def _stranded(e: EngineView, later: str | None, view: FleetView, seconds: float) -> str | None:
    before, after = metric_total(e.metrics, SIM_KV_TRANSFERS_HELD), metric_total(later, SIM_KV_TRANSFERS_HELD)
    if view.router_endpoints is None or not before or after is None or after < before:
        return None
    if _decode_routable(view, e.base_models):
        return None
    return (
        f"holds {after:g} unpulled transfers ({SIM_KV_TRANSFERS_HELD} {before:g} → {after:g} over "
        f"{seconds:g}s) and no decode engine of {', '.join(e.base_models) or 'its model'} is routable"
    )


def pd_findings(view: FleetView, later: dict[str, str | None], seconds: float) -> list[Finding]:
    """The P/D branches found between the first look (`view`) and the engines' metrics `seconds`
    later (`later`, by engine name)."""
    found = _pairs(view)
    for e in view.engines:
        role = role_of(e, view)
        if role not in SPLIT_ROLES or e.name not in later:
            continue
        text = later[e.name]
        failing = _rising(e, text, NIXL_FAILED_TRANSFERS, seconds)
        if failing is not None:
            found.append((e.name, TRANSFER_FAILURES, f"{role} engine: {failing}", _FAILED_NEXT))
        expired = _rising(e, text, NIXL_KV_EXPIRED_REQS, seconds) if role == "prefill" else None
        if expired is not None:
            found.append((e.name, EXPIRED_TRANSFERS, f"prefill engine: {expired}", _EXPIRED_NEXT))
        stranded = _stranded(e, text, view, seconds) if role == "prefill" else None
        if stranded is not None:
            found.append((e.name, STRANDED_BLOCKS, stranded, _STRANDED_NEXT))
    return found


async def _metrics(session: aiohttp.ClientSession, e: EngineView, headers: dict[str, str]) -> str | None:
    try:
        async with session.get(
            f"{e.engine_url}/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=3)
        ) as resp:
            return (await resp.read()).decode(errors="replace") if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def pd_branch(view: FleetView, seconds: float) -> list[Finding]:
    """Nothing on an aggregated fleet; on a P/D fleet, the engines' metrics read again `seconds` after
    the first look, and what changed between the two."""
    if not is_disaggregated(view):
        return []
    engines = [e for e in view.engines if e.engine_url and role_of(e, view) in SPLIT_ROLES]
    await asyncio.sleep(seconds)
    headers = view.target.access.engine_headers()
    async with aiohttp.ClientSession() as session:
        texts = await asyncio.gather(*(_metrics(session, e, headers) for e in engines))
    return pd_findings(view, {e.name: t for e, t in zip(engines, texts, strict=True)}, seconds)
