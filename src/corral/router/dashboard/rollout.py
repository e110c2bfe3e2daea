"""A rollout as the router sees it, for the dashboard's banner: engines that serve the same thing
running more than one bundle. From the supervisors' state streams the router knows each engine's
bundle (its fingerprint and, from supervisors since issue 32, its name) and serving group; a rollout,
whatever started it (`corral rollout`, a rollback, a Kubernetes rolling update), shows as a second
bundle appearing among them and the first one's groups going.

Engines are compared within a lane: the same base models in the same role (a fleet of two models, or
of prefill and decode engines, runs several bundles for good and is not rolling out). In a lane the
bundle seen first is the one being left (`from`), the one seen last the one rolled to (`to`); groups
moved are the groups on `to`, out of those seen on the lane's other bundles during the rollout.
Requests failed are the router's 5xx answers (`totals.errors`) since the rollout began. When every
lane runs one bundle, the rollout has ended and is kept, as `last`, for `KEEP_ENDED_SECONDS`.
`RolloutWatch.update` is called with each fleet view read (the history's ticks and the feed's reads).
"""

from __future__ import annotations

from typing import Any

KEEP_ENDED_SECONDS = 900.0
NAME_SHOWN = 64  # a bundle name longer than this is cut (the router takes up to 128 from a stream)
LEAVING_SHOWN = 256  # engines named as leaving in one rollout (the page words their exits with it)

Lane = tuple[tuple[str, ...], str]  # (base models, role)


class _Bundle:
    """One bundle in one lane as read now: its groups and engines."""

    def __init__(self) -> None:
        self.groups: set[str] = set()
        self.engines: list[str] = []


class RolloutWatch:
    def __init__(self, keep_ended: float = KEEP_ENDED_SECONDS) -> None:
        self._keep_ended = keep_ended
        self._first_seen: dict[str, float] = {}  # bundle fingerprint -> wall time first seen
        self._names: dict[str, str] = {}
        # groups seen on each lane's bundles being left, during the rollout
        self._leaving_groups: set[str] = set()
        self._leaving: set[str] = set()  # engines seen on a bundle being left during the rollout
        self._rolling: set[Lane] = set()  # the lanes that ran two bundles during the rollout
        self._started: float | None = None
        self._errors_at_start = 0
        self._current: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None

    def update(self, fleet: dict[str, Any], wall: float) -> dict[str, Any]:
        """`{"active": {...} | None, "last": {...} | None}` for the page's banner."""
        lanes = self._lanes(fleet)
        for bundles in lanes.values():
            for fingerprint in bundles:
                self._first_seen.setdefault(fingerprint, wall)
        errors = _errors(fleet)
        rolling = {lane: bundles for lane, bundles in lanes.items() if len(bundles) > 1}
        if rolling:
            if self._started is None:
                self._started, self._errors_at_start = wall, errors
                self._leaving_groups, self._leaving, self._rolling = set(), set(), set()
            self._rolling |= set(rolling)
            self._current = self._progress(rolling, errors)
        elif self._started is not None and self._current is not None:
            moved = sum(len(b.groups) for lane in self._rolling for b in lanes.get(lane, {}).values())
            failed = max(0, errors - self._errors_at_start)
            self._last = {**self._current, "ended": wall, "failed": failed, "groups_moved": moved}
            self._started = self._current = None
        if self._started is None:  # a bundle no engine runs is forgotten once no rollout needs it
            running = {f for bundles in lanes.values() for f in bundles}
            for fingerprint in [f for f in self._first_seen if f not in running]:
                del self._first_seen[fingerprint]
                self._names.pop(fingerprint, None)
        if self._last is not None and wall - self._last["ended"] > self._keep_ended:
            self._last = None
        return {"active": self._current, "last": self._last}

    def _lanes(self, fleet: dict[str, Any]) -> dict[Lane, dict[str, _Bundle]]:
        lanes: dict[Lane, dict[str, _Bundle]] = {}
        for e in fleet.get("endpoints") or ():
            supervisor = e.get("supervisor") if isinstance(e, dict) else None
            if not isinstance(supervisor, dict) or not isinstance(supervisor.get("fingerprint"), str):
                continue
            fingerprint = supervisor["fingerprint"]
            name = supervisor.get("bundle_name")
            if isinstance(name, str) and name:
                self._names[fingerprint] = name[:NAME_SHOWN]
            adapters = set(e.get("adapters") or ())
            models = tuple(sorted(str(m) for m in e.get("models") or () if m not in adapters))
            lane = (models, str(e.get("role") or "both"))
            bundle = lanes.setdefault(lane, {}).setdefault(fingerprint, _Bundle())
            bundle.groups.add(str(e.get("group") or e.get("name") or e.get("url")))
            bundle.engines.append(str(e.get("url")))
        return lanes

    def _progress(self, rolling: dict[Lane, dict[str, _Bundle]], errors: int) -> dict[str, Any]:
        froms: list[str] = []
        tos: list[str] = []
        moved = 0
        for bundles in rolling.values():
            order = sorted(bundles, key=lambda f: self._first_seen[f])
            to = order[-1]
            moved += len(bundles[to].groups)
            tos.append(self._name(to))
            for fingerprint in order[:-1]:
                froms.append(self._name(fingerprint))
                self._leaving_groups |= bundles[fingerprint].groups
                for url in bundles[fingerprint].engines:
                    if len(self._leaving) < LEAVING_SHOWN:
                        self._leaving.add(url)
        return {
            "from": sorted(set(froms)),
            "to": ", ".join(sorted(set(tos))),
            "groups_moved": moved,
            "groups": len(self._leaving_groups),  # to be moved: those seen on the bundles being left
            "failed": max(0, errors - self._errors_at_start),
            "since": self._started,
            "leaving": sorted(self._leaving),  # whose drain is for this rollout
        }

    def _name(self, fingerprint: str) -> str:
        return self._names.get(fingerprint) or fingerprint[:12]


def _errors(fleet: dict[str, Any]) -> int:
    totals = fleet.get("totals")
    value = totals.get("errors") if isinstance(totals, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
