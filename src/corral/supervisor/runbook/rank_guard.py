"""The rank watch under a runbook operation (the template's `StepGuard`), and the checks the steps make
of the ranks themselves: a rank lost while a step runs ends the step with `RankLost`, naming the rank
with the rank watch's evidence, and RECOVER runs; VERIFY and POSTCHECK require the ranks whole (every
rank the command asks for seen and alive), and so does PRECHECK before it accepts an operation.

The guard watches the engine that runs when the step begins; an engine the operation itself stops (a
switch of bundle, a restart in place) loses no rank by it (`EngineRanks.stopping`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from corral.supervisor.runbook.template import Evidence, RankLost, Refused, StepFailed

if TYPE_CHECKING:
    from corral.supervisor.runbook.engine_access import EngineAccess


class RankGuard:
    """`broken()` returns once a rank of the engine running now is lost."""

    def __init__(self, sup: EngineAccess) -> None:
        self._sup = sup

    async def broken(self) -> StepFailed:
        engine = self._sup.engine
        if engine is None:
            await asyncio.Event().wait()  # no engine, no rank to lose: the step ends the wait
        assert engine is not None
        loss = await engine.ranks.watch()
        return RankLost(loss.reason, **loss.evidence)


def rank_evidence(sup: EngineAccess) -> dict[str, Any]:
    """The rank watch's evidence of a loss (source, rank, kind, every rank), or the ranks as they are."""
    engine = sup.engine
    if engine is None:
        return {}
    loss = engine.ranks.loss
    if loss is not None:
        return dict(loss.evidence)
    return {"source": "rank_watch", "ranks": engine.ranks.ranks_json()}


def ranks_whole(sup: EngineAccess, when: str) -> Evidence:
    """The ranks' state when every rank is seen and alive; else `RankLost` naming what is not."""
    engine = sup.engine
    if engine is None:
        return {"ranks": "no engine process"}
    missing = engine.ranks.missing()
    if missing is not None:
        raise RankLost(f"{when}: {missing}", **rank_evidence(sup))
    return engine.ranks.summary()


def refuse_unless_whole(sup: EngineAccess, kind: str) -> None:
    """PRECHECK: an engine whose ranks are not whole takes no operation (its rank watch acts)."""
    engine = sup.engine
    missing = engine.ranks.missing() if engine is not None else None
    if missing is not None:
        raise Refused(f"{kind} refused: the engine's ranks are not whole: {missing}")
