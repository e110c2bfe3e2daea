"""Which hub revisions of a vLLM command are pinned: only a 40-hex commit names fixed content, so
`--revision` (or none), `--tokenizer-revision` and `--code-revision` given as a branch or tag float.
PRECHECK refuses what floats, and `corral k8s render` refuses it before a pod is made."""

from __future__ import annotations

import re
from collections.abc import Mapping

_COMMIT = re.compile(r"^[0-9a-f]{40}$")

# the revisions vLLM resolves on the hub besides --revision, by flag and setting name (engine/flags.py)
OTHER_REVISIONS = (("--tokenizer-revision", "tokenizer_revision"), ("--code-revision", "code_revision"))


def is_pinned(revision: str | None) -> bool:
    """Only a 40-hex commit names fixed content: branches move, and hub tags can be deleted and
    re-created on another commit, so a tag is floating too."""
    return revision is not None and bool(_COMMIT.match(revision))


def floating_revisions(settings: Mapping[str, object]) -> list[str]:
    """What floats in the serving settings of a hub model's command, as flags an operator reads:
    `--revision (none given)` or `--revision main`. As in vLLM, the tokenizer follows --revision
    unless --tokenizer-revision is given; a tokenizer or code revision that is given must be pinned too."""
    found: list[str] = []
    revision = settings.get("revision")
    revision = revision if isinstance(revision, str) else None
    if not is_pinned(revision):
        found.append(f"--revision {revision}" if revision else "--revision (none given)")
    for flag, key in OTHER_REVISIONS:
        value = settings.get(key)
        if isinstance(value, str) and not is_pinned(value):
            found.append(f"{flag} {value}")
    return found
