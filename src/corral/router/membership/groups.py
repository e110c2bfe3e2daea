"""Serving groups: engines that serve together and are routed to only as a whole. A group is whole
while it has its declared number of members, every member is READY on its own, and all of them report
one bundle fingerprint; `ServingGroups` keeps each group's members and its verdict, judged on
membership events (never per request) and written onto each member as `Endpoint.group_out`. A member's
tag (`GroupTag`: which group, of what size) is `group_tag.py`'s."""

from __future__ import annotations

from typing import Any

from corral.engine_state import EngineState
from corral.router.membership.endpoint import Endpoint


def member_label(endpoint: Endpoint) -> str:
    return endpoint.name or endpoint.url


def fingerprint_of(endpoint: Endpoint) -> str | None:
    """The bundle fingerprint the endpoint's supervisor last reported (None without one)."""
    return endpoint.supervisor.fingerprint if endpoint.supervisor is not None else None


def group_verdict(name: str, members: list[Endpoint], last_left: str | None = None) -> str | None:
    """Why the group may not be routed to, or None when it is whole. Reads each member's own state
    (`Endpoint.state`), which never includes the group's verdict."""
    sizes = sorted({m.group.size for m in members if m.group is not None})
    if len(sizes) > 1:
        return f"group {name} out: its members disagree on its size ({', '.join(map(str, sizes))})"
    size = sizes[0] if sizes else 0
    for member in members:
        if member.state is not EngineState.READY:
            return f"group {name} out: member {member_label(member)} {member.state.value} ({member.reason})"
    if len(members) != size:
        left = f"; {last_left}" if last_left and len(members) < size else ""
        return f"group {name} out: {len(members)} of {size} members known{left}"
    prints = {fingerprint_of(m) for m in members}
    if len(prints) > 1:
        said = ", ".join(f"{member_label(m)}={fingerprint_of(m) or 'none'}" for m in members)
        return f"group {name} out: its members report different bundle fingerprints ({said})"
    return None


class ServingGroups:
    """The members of every serving group and its verdict; membership calls `judge` after each change
    that can move a verdict (a member added, removed, or its own state changed)."""

    def __init__(self) -> None:
        self._members: dict[str, list[Endpoint]] = {}
        self._last_left: dict[str, str] = {}
        self._verdicts: dict[str, str | None] = {}

    def join(self, endpoint: Endpoint) -> None:
        assert endpoint.group is not None
        self._members.setdefault(endpoint.group.name, []).append(endpoint)

    def leave(self, endpoint: Endpoint, reason: str) -> None:
        assert endpoint.group is not None
        name = endpoint.group.name
        members = self._members.get(name, [])
        if endpoint in members:
            members.remove(endpoint)
            self._last_left[name] = f"member {member_label(endpoint)} left: {reason}"
        endpoint.group_out = None
        if not members:
            self._members.pop(name, None)
            self._last_left.pop(name, None)
            self._verdicts.pop(name, None)

    def members(self, endpoint: Endpoint) -> list[Endpoint]:
        """The endpoint and the other members of its group (just the endpoint when it has none)."""
        if endpoint.group is None:
            return [endpoint]
        return list(self._members.get(endpoint.group.name, [endpoint]))

    def judge(self, name: str) -> list[tuple[Endpoint, bool]]:
        """Recompute group `name`'s verdict onto its members; returns (member, was in routing) for
        each member whose verdict changed."""
        members = self._members.get(name)
        if not members:
            return []
        verdict = group_verdict(name, members, self._last_left.get(name))
        self._verdicts[name] = verdict
        if verdict is None:
            self._last_left.pop(name, None)
        changed: list[tuple[Endpoint, bool]] = []
        for member in members:
            if member.group_out != verdict:
                was_in = member.state is EngineState.READY and member.group_out is None
                member.group_out = verdict
                changed.append((member, was_in))
        return changed

    def to_json(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name, members in sorted(self._members.items()):
            verdict = self._verdicts.get(name)
            out.append(
                {
                    "name": name,
                    "size": members[0].group.size if members[0].group is not None else None,
                    "members": [member_label(m) for m in members],
                    "whole": verdict is None,
                    "why": verdict or "routable: every member READY on one bundle fingerprint",
                    "fingerprints": sorted({fingerprint_of(m) or "none" for m in members}),
                }
            )
        return out
