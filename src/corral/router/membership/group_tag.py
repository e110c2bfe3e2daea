"""A serving group's tag on an endpoint: which group it belongs to and how many members the group has,
read from a pod's label and annotation or a backends file's marker and checked here. The endpoint
carries it; `groups.py` judges the groups."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class GroupTagError(ValueError):
    """A group marker that names no usable group: a bad name or size."""


@dataclass(frozen=True, slots=True)
class GroupTag:
    """Which serving group an endpoint belongs to and how many members that group has."""

    name: str
    size: int

    def __str__(self) -> str:
        return f"{self.name}/{self.size}"


def group_tag(name: str, size: str | int) -> GroupTag:
    """A checked tag: a name of letters, digits, `.`, `_`, `-` (≤ 63) and a size of at least 1."""
    if not _NAME.match(name):
        raise GroupTagError(
            f"serving group name {name!r} is not usable; use letters, digits, '.', '_' or '-' (at most 63)"
        )
    try:
        members = int(size)
    except (TypeError, ValueError):
        raise GroupTagError(
            f"serving group {name!r}: size {size!r} is not a whole number; give its member count, e.g. 2"
        ) from None
    if members < 1:
        raise GroupTagError(f"serving group {name!r}: size {members} is below 1; give its member count")
    return GroupTag(name, members)
