"""The page of picks one router replica serves its peers (`GET /internal/peer-picks?after=CURSOR`) and
the strict reading of one: JSON, at most `MAX_PAGE_PICKS` picks and `MAX_PAGE_BYTES` bytes, each pick
an endpoint url, the policy that made it, the endpoint's prefix-epoch hash and at most `MAX_KEYS`
prefix keys. A page that breaks any bound or type is refused whole (`PeerWireError`): a peer's page is
input from another host, never trusted.

The cursor is one sequence number per worker of the serving router (`--workers N`), dotted
("12.7.0"): opaque to the reader, who sends back the last one it was given. `incarnation` names the
serving router's life: a new one (a restart) starts the reader's cursor again from nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from corral.router.routing.prompt import MAX_KEYS

PEER_PICKS_PATH = "/internal/peer-picks"
MAX_PAGE_PICKS = 256
MAX_PAGE_BYTES = 256 * 1024
MAX_URL_CHARS = 2048
MAX_POLICY_CHARS = 128
MAX_INCARNATION_CHARS = 64
MAX_CURSOR_PARTS = 256  # `--workers` is at most 256
UNKNOWN_POLICY = "-"  # a pick not made by a scored policy: no recent pick to count
_MAX_SEQ = (1 << 63) - 1
_MAX_KEY = (1 << 64) - 1
_CURSOR = re.compile(r"^[0-9]{1,19}(\.[0-9]{1,19}){0,255}$")
_INCARNATION = re.compile(r"^[0-9a-zA-Z_-]{1,64}$")
# What one pick may add to a page beyond its url: brackets, indices, the epoch, its keys (20 digits +
# a comma each); the server stops filling a page before the bound, the reader checks it.
_PICK_BYTES = 64
_KEY_BYTES = 21


class PeerWireError(Exception):
    """A page or cursor that breaks the format or a bound; the message says which."""


@dataclass(frozen=True, slots=True)
class PeerPick:
    url: str  # the endpoint the peer picked
    policy: str  # the policy that picked it (its name)
    epoch_hash: int  # `worker_journal.hash_epoch` of the endpoint's prefix epoch then (0: none)
    keys: tuple[int, ...]  # the prompt's prefix keys, shallowest first (empty: none learnt)


@dataclass(frozen=True, slots=True)
class PeerPage:
    incarnation: str
    cursor: str  # send it back as `after` for the picks that follow these
    more: bool  # the page was full: more picks wait
    picks: Sequence[PeerPick]


def pick_bytes(pick: PeerPick) -> int:
    """An upper bound on what `pick` adds to an encoded page (its url counted once per page)."""
    return _PICK_BYTES + _KEY_BYTES * len(pick.keys) + len(pick.url) + len(pick.policy)


def parse_cursor(text: str) -> list[int]:
    """The sequence numbers of a cursor ("" or absent: from the start)."""
    if not text:
        return []
    if len(text) > MAX_CURSOR_PARTS * 20 or not _CURSOR.match(text):
        raise PeerWireError("after: give the cursor of the last page, digits separated by dots")
    parts = [int(p) for p in text.split(".")]
    if any(p > _MAX_SEQ for p in parts):
        raise PeerWireError("after: a sequence number past 2**63")
    return parts


def format_cursor(seqs: Sequence[int]) -> str:
    return ".".join(str(s) for s in seqs)


def encode_page(page: PeerPage) -> bytes:
    urls: dict[str, int] = {}
    policies: dict[str, int] = {}
    rows = [
        [
            urls.setdefault(p.url, len(urls)),
            policies.setdefault(p.policy, len(policies)),
            p.epoch_hash,
            list(p.keys),
        ]
        for p in page.picks
    ]
    return orjson.dumps(
        {
            "incarnation": page.incarnation,
            "cursor": page.cursor,
            "more": page.more,
            "urls": list(urls),
            "policies": list(policies),
            "picks": rows,
        }
    )


def _strings(value: Any, what: str, most: int, chars: int) -> list[str]:
    if not isinstance(value, list) or len(value) > most:
        raise PeerWireError(f"{what}: not a list of at most {most}")
    for item in value:
        if not isinstance(item, str) or not item or len(item) > chars:
            raise PeerWireError(f"{what}: an entry that is not a string of 1 to {chars} characters")
    return value


def _index(value: Any, size: int, what: str) -> int:
    if type(value) is not int or not 0 <= value < size:
        raise PeerWireError(f"picks: a {what} index outside 0..{size - 1}")
    return value


def _word(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_KEY:
        raise PeerWireError(f"picks: a {what} that is not an integer in 0..2**64-1")
    return value


def decode_page(body: bytes) -> PeerPage:
    """The page in `body`, checked against every bound; `PeerWireError` names the first one broken."""
    if len(body) > MAX_PAGE_BYTES:
        raise PeerWireError(f"page of {len(body)} bytes, over the {MAX_PAGE_BYTES} allowed")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise PeerWireError("page is not JSON") from None
    if not isinstance(doc, dict):
        raise PeerWireError("page is not a JSON object")
    incarnation, cursor, more = doc.get("incarnation"), doc.get("cursor"), doc.get("more")
    if not isinstance(incarnation, str) or not _INCARNATION.match(incarnation):
        raise PeerWireError("incarnation: not 1 to 64 letters, digits, - or _")
    if not isinstance(cursor, str) or not cursor:
        raise PeerWireError("cursor: not a string")
    parse_cursor(cursor)
    if not isinstance(more, bool):
        raise PeerWireError("more: not true or false")
    urls = _strings(doc.get("urls"), "urls", MAX_PAGE_PICKS, MAX_URL_CHARS)
    policies = _strings(doc.get("policies"), "policies", MAX_PAGE_PICKS, MAX_POLICY_CHARS)
    rows = doc.get("picks")
    if not isinstance(rows, list) or len(rows) > MAX_PAGE_PICKS:
        raise PeerWireError(f"picks: not a list of at most {MAX_PAGE_PICKS}")
    picks: list[PeerPick] = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 4:
            raise PeerWireError("picks: an entry that is not [url, policy, epoch, keys]")
        url = urls[_index(row[0], len(urls), "url")]
        policy = policies[_index(row[1], len(policies), "policy")]
        epoch = _word(row[2], "prefix epoch")
        keys = row[3]
        if not isinstance(keys, list) or len(keys) > MAX_KEYS:
            raise PeerWireError(f"picks: keys that are not a list of at most {MAX_KEYS}")
        picks.append(PeerPick(url, policy, epoch, tuple(_word(k, "key") for k in keys)))
    return PeerPage(incarnation, cursor, more, picks)
