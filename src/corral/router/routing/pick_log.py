"""The recent picks this router replica serves its peers (`--peer`): read from the host's worker
journals (`worker_journal`), the same shared-memory rings the `--workers N` read from one another, so
whichever worker a peer's request lands on answers with every worker's picks, in one cursor (one
sequence number per worker). Bounded by the journals (the last `PICKS_KEPT` picks of each worker) and
per page (`peer_wire.MAX_PAGE_PICKS`, `MAX_PAGE_BYTES`). Picks this router learnt from its own peers
(relayed to its siblings) are left out: a pick is served only by the router that made it.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.router.routing.peer_wire import (
    MAX_PAGE_BYTES,
    MAX_PAGE_PICKS,
    MAX_URL_CHARS,
    UNKNOWN_POLICY,
    PeerPage,
    PeerPick,
    format_cursor,
    pick_bytes,
)
from corral.router.routing.worker_journal import PICKS_KEPT, PickRecord, WorkerSync

_PAGE_HEAD_BYTES = 512  # the page's own fields


class PickLog:
    """Pages of this router's picks after a cursor, made by the worker that answers."""

    def __init__(self, sync: WorkerSync, incarnation: str) -> None:
        self.sync = sync
        self.incarnation = incarnation
        self._names = [policy.name for policy in sync.policies]

    def page(
        self, after: Sequence[int], most: int = MAX_PAGE_PICKS, budget: int = MAX_PAGE_BYTES
    ) -> PeerPage:
        """The picks after `after` (a sequence number per worker; missing ones: 0), oldest first per
        worker, at most `most` of them and about `budget` bytes encoded. A number past what its worker
        wrote (a cursor of this router's earlier life) starts that worker again from its newest pick."""
        journals = self.sync.journals
        most, budget = min(most, MAX_PAGE_PICKS), min(budget, MAX_PAGE_BYTES) - _PAGE_HEAD_BYTES
        cursor: list[int] = []
        picks: list[PeerPick] = []
        urls: set[str] = set()
        more = False
        for index in range(1, journals.count + 1):
            written = journals.picks_written(index)
            seq = after[index - 1] if index - 1 < len(after) else 0
            if seq > written:
                seq = written
            seq = max(seq, written - PICKS_KEPT)  # lapped: what the ring still holds
            while seq < written:
                if len(picks) >= most:
                    more = True
                    break
                record = journals.read_pick(index, seq + 1)
                pick = self._pick(record) if record is not None and not record.relayed else None
                if pick is not None:
                    size = pick_bytes(pick) - (len(pick.url) if pick.url in urls else 0)
                    if size > budget:
                        more = True
                        break
                    budget -= size
                    urls.add(pick.url)
                    picks.append(pick)
                seq += 1
            cursor.append(seq)
        return PeerPage(self.incarnation, format_cursor(cursor), more, picks)

    def _pick(self, record: PickRecord) -> PeerPick | None:
        endpoint = self.sync.resolve(record.url_hash)
        if endpoint is None or len(endpoint.url) > MAX_URL_CHARS:  # it left membership since
            return None
        names = self._names
        policy = names[record.policy_index] if record.policy_index < len(names) else UNKNOWN_POLICY
        return PeerPick(endpoint.url, policy, record.epoch_hash, record.keys)
