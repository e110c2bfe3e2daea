"""A rollout as the router sees it, for the dashboard's banner: the fleet's engines running more
than one bundle. From the supervisors' state streams the router knows each engine's bundle (its
fingerprint and, from supervisors since issue 32, its name) and serving group; a rollout, whatever
started it (`corral rollout`, a rollback, a Kubernetes rolling update), shows as a second bundle
appearing and the first one's groups going.

`RolloutWatch.update` is called with each fleet view read (the history's ticks and the feed's
reads): the bundle seen first is the one being left (`from`), the one seen last the one being
rolled to (`to`); groups moved are the groups on `to`, out of the groups seen on the other bundles
during the rollout; requests
failed are the router's 5xx answers (`totals.errors`) since the second bundle appeared. When one
bundle is left, the rollout has ended and is kept, as `last`, for `KEEP_ENDED_SECONDS`.
"""

from __future__ import annotations

from typing import Any

KEEP_ENDED_SECONDS = 900.0
NAME_SHOWN = 64  # a bundle name longer than this is cut (the router takes up to 128 from a stream)
LEAVING_SHOWN = 256  # engines named as leaving in one rollout (the page words their exits with it)


class RolloutWatch:
    def __init__(self, keep_ended: float = KEEP_ENDED_SECONDS) -> None:
        self._keep_ended = keep_ended
        self._first_seen: dict[str, float] = {}  # bundle fingerprint -> wall time first seen
        self._names: dict[str, str] = {}
        self._groups: dict[str, set[str]] = {}  # groups seen on each bundle during the rollout
        self._leaving: set[str] = set()  # engines seen on a bundle being left during the rollout
        self._started: float | None = None
        self._errors_at_start = 0
        self._current: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None

    def update(self, fleet: dict[str, Any], wall: float) -> dict[str, Any]:
        """`{"active": {...} | None, "last": {...} | None}` for the page's banner."""
        bundles: dict[str, set[str]] = {}
        engines: dict[str, list[str]] = {}  # bundle fingerprint -> engine URLs
        for e in fleet.get("endpoints") or ():
            supervisor = e.get("supervisor") if isinstance(e, dict) else None
            if not isinstance(supervisor, dict) or not isinstance(supervisor.get("fingerprint"), str):
                continue
            fingerprint = supervisor["fingerprint"]
            name = supervisor.get("bundle_name")
            if isinstance(name, str) and name:
                self._names[fingerprint] = name[:NAME_SHOWN]
            bundles.setdefault(fingerprint, set()).add(str(e.get("group") or e.get("name") or e.get("url")))
            engines.setdefault(fingerprint, []).append(str(e.get("url")))
        for fingerprint in bundles:
            self._first_seen.setdefault(fingerprint, wall)
        errors = _errors(fleet)
        if len(bundles) > 1:
            if self._started is None:
                self._started = wall
                self._errors_at_start = errors
                self._groups = {}
                self._leaving = set()
            for fingerprint, groups in bundles.items():
                self._groups.setdefault(fingerprint, set()).update(groups)
            order = sorted(bundles, key=lambda f: self._first_seen[f])
            to = order[-1]
            leaving = set().union(*(g for f, g in self._groups.items() if f != to))
            for fingerprint in order[:-1]:
                for url in engines[fingerprint]:
                    if len(self._leaving) < LEAVING_SHOWN:
                        self._leaving.add(url)
            self._current = {
                "from": [self._name(f) for f in order[:-1]],
                "to": self._name(to),
                "groups_moved": len(bundles[to]),
                "groups": len(leaving),  # to be moved: those seen on the other bundles
                "failed": max(0, errors - self._errors_at_start),
                "since": self._started,
                "leaving": sorted(self._leaving),  # whose drain is for this rollout
            }
        elif self._started is not None and self._current is not None:
            self._last = {**self._current, "ended": wall, "failed": max(0, errors - self._errors_at_start)}
            self._last["groups_moved"] = sum(len(g) for g in bundles.values())
            self._started = self._current = None
            self._groups = {}
        # a bundle no engine runs any more is forgotten once no rollout needs its first sighting
        if self._started is None:
            for fingerprint in [f for f in self._first_seen if f not in bundles]:
                del self._first_seen[fingerprint]
                self._names.pop(fingerprint, None)
        if self._last is not None and wall - self._last["ended"] > self._keep_ended:
            self._last = None
        return {"active": self._current, "last": self._last}

    def _name(self, fingerprint: str) -> str:
        return self._names.get(fingerprint) or fingerprint[:12]


def _errors(fleet: dict[str, Any]) -> int:
    totals = fleet.get("totals")
    value = totals.get("errors") if isinstance(totals, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
