"""The runbook's post-operation checklist as code: each check looks at a `FleetView` (and the smoke
requests) and passes, fails, or only reports (`warn`), with the evidence in one line.

Check names are stable; they are what the table, the change record and the tests name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from corral.contracts.traffic import WindowSummary, WindowThresholds
from corral.engine.evidence import KINDS, KV_SHORTFALL
from corral.engine_state import EngineState
from corral.fleet.checks.adapters import KeptAdapters
from corral.fleet.checks.check import FAIL as FAIL
from corral.fleet.checks.check import NOT_MEASURED as NOT_MEASURED
from corral.fleet.checks.check import PASS as PASS
from corral.fleet.checks.check import WARN as WARN
from corral.fleet.checks.check import Check as Check
from corral.fleet.checks.expected_sleep import ExpectedAsleep, asleep_problems
from corral.fleet.checks.leftovers import check_cleanup
from corral.fleet.checks.pairs import check_pairs, serving_group_key
from corral.fleet.checks.probe import EngineView, FleetView
from corral.fleet.checks.smoke import SmokeSample as SmokeSample
from corral.fleet.checks.smoke import smoke as smoke
from corral.fleet.checks.verify_memory import FAILED, PASSED, kv_capacity_outcome, memory_outcome


@dataclass(frozen=True)
class Expectations:
    model: str | None = None
    adapters: tuple[str, ...] | None = None  # None: only that every engine of a group has the same
    explained: dict[str, str] = field(default_factory=dict)  # evidence kind -> operator's explanation
    asleep: tuple[ExpectedAsleep, ...] = ()  # engines a planned sleep should have put to sleep
    require_measured: bool = False  # a check that could not be measured fails (--require-measured)
    kept_adapters: KeptAdapters | None = None  # what the last change record served: none may be lost

    def expected_asleep(self, engine: EngineView) -> ExpectedAsleep | None:
        return next((a for a in self.asleep if a.matches(engine)), None)


@dataclass(frozen=True)
class SteadyBaseline:
    """The steady window of the newest change record that has one, and which record it came from."""

    summary: WindowSummary
    source: str


@dataclass(frozen=True)
class Observation:
    """What `--observe-seconds` brought: the `traffic` check, the fleet's steady window (None when
    nothing could be read) and the baseline it was compared with."""

    traffic: Check
    steady: WindowSummary | None = None
    baseline: SteadyBaseline | None = None


def _names(engines: list[EngineView]) -> str:
    return ", ".join(e.name for e in engines)


def check_processes(view: FleetView, expect: Expectations) -> Check:
    supervised = [e for e in view.engines if e.supervisor_url is not None]
    if not supervised:
        return Check("processes", WARN, "no supervisors given: process and rank state not checked")
    asleep = [e for e in supervised if expect.expected_asleep(e) is not None]
    bad = [e for e in supervised if e.lifecycle != EngineState.READY and e not in asleep]
    if bad:
        detail = "; ".join(
            f"{e.name} {e.lifecycle}" + (f" ({e.state_error or (e.state or {}).get('reason')})") for e in bad
        )
        return Check("processes", FAIL, f"not READY: {detail}")
    restarted = [e for e in supervised if (e.state or {}).get("restarts")]
    note = f"; restarted before READY: {_names(restarted)}" if restarted else ""
    if asleep:
        note += f"; expected asleep (see sleep): {_names(asleep)}"
    return Check("processes", PASS, f"{len(supervised) - len(asleep)} supervisors READY{note}")


def check_model(view: FleetView, expect: Expectations) -> Check:
    answering = [e for e in view.engines if e.models is not None]
    if not answering:
        if not view.engines and view.router_error:
            return Check("model", FAIL, "no engine to ask: the router's list could not be read (membership)")
        why = "; ".join(e.models_problem for e in view.engines if e.engine_url)
        return Check("model", FAIL, "no engine answered /v1/models" + (f": {why}" if why else ""))
    first = answering[0].base_models
    wanted = expect.model or (first[0] if first else "?")
    wrong = [e for e in answering if wanted not in e.base_models]
    if wrong:
        return Check(
            "model",
            FAIL,
            "; ".join(f"{e.name} serves {e.base_models}, expected {wanted}" for e in wrong),
        )
    return Check("model", PASS, f"{len(answering)} engines serve {wanted}")


def check_adapters(view: FleetView, expect: Expectations) -> Check:
    answering = [e for e in view.engines if e.models is not None]
    if expect.adapters is not None:
        wanted = sorted(expect.adapters)
        wrong = [e for e in answering if e.adapters != wanted]
        if wrong:
            detail = "; ".join(f"{e.name} has {e.adapters or 'none'}" for e in wrong)
            return Check("adapters", FAIL, f"expected {wanted or 'none'}: {detail}")
        return Check("adapters", PASS, f"every engine has {wanted or 'no adapters'}")
    sets = {tuple(e.adapters) for e in answering}
    if len(sets) > 1:
        detail = "; ".join(f"{e.name} has {e.adapters or 'none'}" for e in answering)
        return Check("adapters", FAIL, f"engines of the fleet differ: {detail}")
    only = next(iter(sets), ())
    return Check("adapters", PASS, f"every engine has {list(only) or 'no adapters'}")


def check_adapters_kept(view: FleetView, expect: Expectations) -> Check:
    """Every adapter the last change record served is still served by every engine, unless the
    operator said it was removed on purpose (--allow-adapter-removal NAME)."""
    kept = expect.kept_adapters
    if kept is None:
        return Check("adapters_kept", PASS, "no earlier change record lists adapters")
    answering = [(e.name, e.adapters) for e in view.engines if e.models is not None]
    lost = kept.lost(answering)
    if lost:
        detail = "; ".join(f"adapter {n!r} not served by {', '.join(engines)}" for n, engines in lost.items())
        return Check(
            "adapters_kept",
            FAIL,
            f"{detail} (served per {kept.source}); load it again, or pass --allow-adapter-removal NAME "
            "if it was unloaded on purpose",
        )
    removed = sorted(kept.names & kept.allowed_removal)
    note = f"; removed on purpose: {', '.join(removed)}" if removed else ""
    names = sorted(kept.names - kept.allowed_removal)
    return Check(
        "adapters_kept", PASS, f"every engine serves {names or 'no adapters'} as per {kept.source}{note}"
    )


def check_bundle(view: FleetView) -> Check:
    supervised = [e for e in view.engines if e.state is not None and e.lifecycle == EngineState.READY]
    if not supervised:
        return Check("bundle", WARN, "no READY supervisor to report a bundle")
    missing = [e for e in supervised if e.fingerprint is None]
    if missing:
        return Check("bundle", FAIL, f"READY without a bundle fingerprint: {_names(missing)}")
    groups: dict[tuple[str, ...], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for e in supervised:
        groups[serving_group_key(e)][str(e.fingerprint)].append(e.name)
    mixed = {g: fps for g, fps in groups.items() if len(fps) > 1}
    if mixed:
        detail = "; ".join(f"group {list(g)}: {dict(fps)}" for g, fps in mixed.items())
        return Check("bundle", FAIL, f"a serving group mixes fingerprints: {detail}")
    detail = ", ".join(f"{list(g)} = {next(iter(fps))}" for g, fps in groups.items())
    return Check("bundle", PASS, f"one fingerprint per serving group: {detail}")


def check_health(view: FleetView, expect: Expectations) -> Check:
    ready = [
        e
        for e in view.engines
        if e.lifecycle == EngineState.READY
        or e.supervisor_url is None
        or expect.expected_asleep(e) is not None
    ]
    bad = [e for e in ready if e.health != 200]
    if bad:
        return Check("health", FAIL, "; ".join(f"{e.name} /health {e.health or 'unreachable'}" for e in bad))
    return Check("health", PASS, f"{len(ready)} engines answer /health 200")


def check_sleep(view: FleetView, expect: Expectations) -> Check:
    """Every engine awake, except those `--expect-asleep` names: each of those asleep as expected."""
    problems = [
        f"no engine {w.engine!r} to be asleep (engines: {_names(view.engines)})"
        for w in expect.asleep
        if not any(w.matches(e) for e in view.engines)
    ]
    expected: list[str] = []
    awake: list[EngineView] = []
    for e in view.engines:
        wanted = expect.expected_asleep(e)
        if wanted is None:
            awake.append(e)
            continue
        expected.append(e.name + (f" level {wanted.level}" if wanted.level is not None else ""))
        problems += [f"{e.name} (expected asleep): {p}" for p in asleep_problems(e, wanted)]
    sleeping = [e for e in awake if e.sleeping]
    if sleeping:
        problems.append(f"sleeping (expected awake): {_names(sleeping)}")
    if problems:
        return Check("sleep", FAIL, "; ".join(problems))
    unknown = [e for e in awake if e.sleeping is None and e.health == 200]
    note = f" ({len(unknown)} without /is_sleeping: dev mode off)" if unknown else ""
    if expected:
        detail = f"asleep as expected: {', '.join(expected)}; no other engine sleeping"
        return Check("sleep", PASS, detail + note)
    return Check("sleep", PASS, "no engine sleeping" + note)


def _measured(name: str, found: tuple[str, str] | None, expect: Expectations) -> Check:
    if found is None:
        return Check(name, WARN, "no supervisors given: memory not checked")
    outcome, detail = found
    if outcome == PASSED:
        return Check(name, PASS, detail)
    if outcome == FAILED or expect.require_measured:
        return Check(name, FAIL, detail)
    return Check(name, NOT_MEASURED, detail)


def check_memory(view: FleetView, expect: Expectations) -> Check:
    """Each supervisor's last memory verdict: at READY, or its last sleep/wake/reload's VERIFY."""
    return _measured("memory", memory_outcome(view.engines), expect)


def check_kv_capacity(view: FleetView, expect: Expectations) -> Check:
    """vLLM's logged KV cache size against each engine's PRECHECK memory budget; a shortfall the
    operator explained (`--explain kv_shortfall=WHY`) passes with the explanation."""
    found = kv_capacity_outcome(view.engines)
    why = expect.explained.get(KV_SHORTFALL)
    if found is not None and found[0] == FAILED and why is not None:
        return Check("kv_capacity", PASS, f"{found[1]} (explained: {why})")
    return _measured("kv_capacity", found, expect)


def check_membership(view: FleetView) -> Check:
    if view.router_endpoints is None:
        verdict = FAIL if view.target.router else WARN
        return Check("membership", verdict, view.router_error or "no router given")
    by_url = view.by_engine_url()
    problems: list[str] = []
    for ep in view.router_endpoints:
        url = ep.url
        engine = by_url.get(url)
        if not ep.routable or engine is None:
            continue
        if engine.health != 200:
            problems.append(f"router routes to {url}, which answers /health {engine.health or 'nothing'}")
        elif engine.state is not None and engine.lifecycle != EngineState.READY:
            problems.append(f"router routes to {url}, whose supervisor says {engine.lifecycle}")
    routed = {ep.url for ep in view.router_endpoints if ep.routable}
    for e in view.engines:
        if e.lifecycle == EngineState.READY and e.engine_url not in routed:
            problems.append(f"{e.name} is READY but the router does not route to it")
    if problems:
        return Check("membership", FAIL, "; ".join(problems))
    return Check("membership", PASS, f"router routes to exactly the {len(routed)} ready engines")


def check_evidence(view: FleetView, expect: Expectations) -> Check:
    found: list[str] = []
    explained: list[str] = []
    for e in view.engines:
        for kind, entry in e.evidence.items():
            count = int((entry or {}).get("count", 0))
            if count and kind in expect.explained:
                explained.append(f"{e.name} {kind}×{count} ({expect.explained[kind]})")
            elif count:
                last = ((entry or {}).get("last") or [""])[-1]
                found.append(f"{e.name} {kind}×{count}: {last[:160]}")
    if found:
        return Check("evidence", FAIL, "unexplained: " + "; ".join(found))
    detail = f"no {'/'.join(KINDS)} events in the operation logs"
    return Check("evidence", PASS, detail + (f"; explained: {'; '.join(explained)}" if explained else ""))


def check_latency(
    ttft_ms: float | None, previous: dict[str, Any] | None, observed: Observation | None = None
) -> Check:
    """Reported, never failed on (the `traffic` check judges the window): steady state against the
    last record's steady state when a window was observed; else one probe against the last probe,
    which is noise, not a trend."""
    steady = observed.steady if observed is not None else None
    if observed is not None and steady is not None and steady.ttft_p99_ms is not None:
        now, p50 = steady.ttft_p99_ms, steady.ttft_p50_ms or 0.0
        line = f"steady TTFT p99 {now:.1f} ms (p50 {p50:.1f} ms) over {steady.requests} requests"
        base = observed.baseline
        before = base.summary.ttft_p99_ms if base is not None else None
        if base is None or before is None:
            return Check("latency", PASS, f"{line}; no earlier record has a steady window to compare")
        return _compared("latency", now, before, f"{line}, steady p99 {before:.1f} ms in {base.source}")
    probe = "one probe request, not steady state (--observe-seconds measures it)"
    if ttft_ms is None:
        return Check("latency", WARN, f"no TTFT sample (smoke did not stream a token); {probe}")
    before = (previous or {}).get("ttft_ms")
    if not isinstance(before, int | float):
        return Check("latency", PASS, f"TTFT {ttft_ms:.1f} ms from {probe}; no earlier record to compare")
    return _compared(
        "latency", ttft_ms, before, f"TTFT {ttft_ms:.1f} ms from {probe}, last record's {before:.1f} ms"
    )


def _compared(name: str, now: float, before: float, line: str) -> Check:
    limits = WindowThresholds()
    ratio = now / before if before > 0 else 1.0
    worse = ratio > limits.max_ttft_ratio and now - before > limits.ttft_slack_ms
    return Check(name, WARN if worse else PASS, f"{line} (×{ratio:.2f})")


async def run_checks(
    view: FleetView,
    expect: Expectations,
    previous: dict[str, Any] | None,
    observed: Observation | None = None,
) -> tuple[list[Check], float | None]:
    """Every check, in the checklist's order (`traffic` when a window was observed), and the smoke
    request's TTFT for the change record."""
    checks = [
        check_processes(view, expect),
        check_model(view, expect),
        check_adapters(view, expect),
        check_adapters_kept(view, expect),
        check_bundle(view),
        check_health(view, expect),
        check_sleep(view, expect),
        check_memory(view, expect),
        check_kv_capacity(view, expect),
        check_membership(view),
        check_pairs(view, expect.require_measured),  # P/D fleets: roles agree, a compatible pair routable
        await check_cleanup(view, expect.require_measured),  # what operations left behind
    ]
    model = expect.model or next((m for e in view.engines for m in e.base_models), None)
    ready = next(  # a sleeping engine answers /health 200 but would hold the smoke request
        (e.engine_url for e in view.engines if e.health == 200 and not e.sleeping and e.engine_url), None
    )
    base = view.target.router or ready
    sample = SmokeSample(Check("smoke", FAIL, "nowhere to send it: no router and no healthy engine"))
    if model is None:
        sample = SmokeSample(Check("smoke", FAIL, "no model to ask for: no engine answered /v1/models"))
    elif view.target.router:  # a tenant key to the router; the engine's key to an engine only
        access = view.target.access
        sample = await smoke(view.target.router, model, access.router_headers(), access.router_refused)
    elif base is not None:
        sample = await smoke(base, model, view.target.access.engine_headers())
    checks += [sample.check, *([observed.traffic] if observed is not None else [])]
    checks += [check_latency(sample.ttft_ms, previous, observed), check_evidence(view, expect)]
    return checks, sample.ttft_ms
