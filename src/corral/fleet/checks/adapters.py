"""A fleet's LoRA adapters as operations carry and compare them: the fleet's desired set
(`contracts/fleet_adapters.py`, which the router's adapter carry reads too), and which adapters a change
record says the fleet served, so a later look can name any it silently lost."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KeptAdapters:
    """The adapters a change record says the fleet served (`source` names that record), and those
    the operator says were removed on purpose (`corral verify --allow-adapter-removal NAME`)."""

    names: frozenset[str]
    source: str
    allowed_removal: frozenset[str] = field(default_factory=frozenset)

    def lost(self, engines: Iterable[tuple[str, list[str]]]) -> dict[str, list[str]]:
        """adapter -> the engines (name, served adapters) that no longer serve it, for every adapter
        of the record not allowed to go."""
        lost: dict[str, list[str]] = {}
        for engine, served in engines:
            for name in sorted(self.names - self.allowed_removal - set(served)):
                lost.setdefault(name, []).append(engine)
        return lost


def adapter_baseline(kept: KeptAdapters | None, engines: Iterable[list[str]]) -> list[str]:
    """What the next look should find served (a record's `adapters.served`): every adapter an engine
    serves now, and every one the last record served that was not removed on purpose, so a loss
    stays a loss in the next record too, until it is loaded again or allowed."""
    names = {name for served in engines for name in served}
    if kept is not None:
        names |= kept.names - kept.allowed_removal
    return sorted(names)


def recorded_adapters(record: dict[str, Any]) -> frozenset[str] | None:
    """What a change record says the fleet served (`adapters.served`; for a verify record from
    before it had one, every adapter it saw on an engine); None when the record does not say."""
    section = record.get("adapters")
    if isinstance(section, dict) and isinstance(section.get("served"), list):
        return frozenset(str(n) for n in section["served"])
    engines = record.get("engines")
    if isinstance(engines, list):
        return frozenset(str(a) for e in engines if isinstance(e, dict) for a in (e.get("adapters") or []))
    return None


def last_adapters(
    records: Iterable[tuple[str, dict[str, Any] | None]],
    allowed_removal: Iterable[str] = (),
    router: str | None = None,
) -> KeptAdapters | None:
    """From (where, record) pairs, the newest record (by `finished`) that says which adapters the
    fleet served, skipping those of another router than `router` (when both say); None when none
    does."""
    best: tuple[float, str, frozenset[str]] | None = None
    for where, record in records:
        if record is None:
            continue
        if router and record.get("router") and str(record["router"]).rstrip("/") != router.rstrip("/"):
            continue  # another fleet's record under the same port
        names = recorded_adapters(record)
        finished = record.get("finished")
        if names is None or not isinstance(finished, int | float):
            continue
        if best is None or finished > best[0]:
            best = (float(finished), f"{record.get('kind', 'record')} {where}", names)
    if best is None:
        return None
    return KeptAdapters(best[2], best[1], frozenset(allowed_removal))
