"""A disaggregated engine's KV transfers as a drain waits for them: a prefill engine's blocks held for a
remote decode until they are pulled or its lease expires them, a decode engine's pulls until they finish,
read from the engine's own `/metrics`; what could not be measured is named, never counted as 0.

vLLM 0.32 shows no figure of the blocks a prefill engine holds (its NIXL connector keeps them inside the
worker; only `vllm:nixl_num_kv_expired_reqs` counts the ones that expired); `corral sim` shows
`corral_sim_kv_transfers_held`. A decode engine's pulls are `vllm:num_requests_kv_fetch_by_stage`
(stages waiting_to_start and in_progress) or the sim's `corral_sim_kv_pulls_in_flight`. Where the held
figure is not measured, the drain relies on the routers' acknowledgements (each waits for the decode legs
it started from the engine's transfers) and waits `--drain-transfer-wait` seconds only if asked to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from corral.engine.flags import flag_value
from corral.engine.load_sample import MetricsUnavailable, fetch_metrics_text
from corral.engine.metric_names import (
    KV_FETCH_BY_STAGE,
    NIXL_KV_EXPIRED_REQS,
    SIM_KV_PULLS_IN_FLIGHT,
    SIM_KV_TRANSFERS_HELD,
)
from corral.engine.metrics_text import samples
from corral.engine.pd_protocol import lease_seconds, parse_kv_transfer_config, role_of

NOT_MEASURED = "not_measured"
# The engine frees an expired lease's blocks on its next step: allow that much past the lease.
EXPIRY_GRACE_S = 1.0
# vLLM's stages of a decode request whose KV is still being pulled (not `completed_waiting`: pulled).
PULLING_STAGES = frozenset({"waiting_to_start", "in_progress"})
HELD_NOT_MEASURED = (
    "held: the engine shows no figure of the blocks it holds for remote decode (vLLM's NIXL connector "
    "keeps them inside its worker); the routers' acknowledgements confirm the decode legs they started"
)
PULLS_NOT_MEASURED = "pulls: the engine shows neither vllm:num_requests_kv_fetch_by_stage nor the sim's pulls"
EXPIRED_NOT_MEASURED = f"timed_out: the engine shows no {NIXL_KV_EXPIRED_REQS}"

Log = Callable[[str], None]


@dataclass(frozen=True)
class TransferSide:
    """What a drain must wait for on one engine: its role in a disaggregated fleet and its lease."""

    role: str  # prefill | decode | both (a kv_both engine may do either)
    lease_seconds: float  # how long it holds a finished prefill's blocks for the decode engine

    @classmethod
    def of_command(cls, argv: Sequence[str]) -> TransferSide | None:
        """From the engine's --kv-transfer-config; None for an aggregated engine (none given) or one
        vLLM would refuse to start (nothing to drain then)."""
        text = flag_value(argv, "--kv-transfer-config")
        if text is None:
            return None
        try:
            config = parse_kv_transfer_config(text)
            return cls(role=role_of(config), lease_seconds=lease_seconds(config))
        except ValueError:
            return None

    @property
    def holds(self) -> bool:
        return self.role in ("prefill", "both")

    @property
    def pulls(self) -> bool:
        return self.role in ("decode", "both")


@dataclass(frozen=True)
class TransferFigures:
    """One reading of the engine's transfer figures (None: the engine does not show it)."""

    held: float | None
    pulls: float | None
    expired: float | None
    at: float


def read_transfers(text: str, at: float | None = None) -> TransferFigures:
    """The figures in a `/metrics` text, each summed over its label sets; raises ValueError on text
    that is not Prometheus exposition."""
    held = pulls = fetching = expired = None
    names = (SIM_KV_TRANSFERS_HELD, SIM_KV_PULLS_IN_FLIGHT, KV_FETCH_BY_STAGE, NIXL_KV_EXPIRED_REQS)
    for s in samples(text, names, strict=True):
        if s.name == SIM_KV_TRANSFERS_HELD:
            held = (held or 0.0) + s.value
        elif s.name == SIM_KV_PULLS_IN_FLIGHT:
            pulls = (pulls or 0.0) + s.value
        elif s.name == KV_FETCH_BY_STAGE:
            fetching = (fetching or 0.0) + (s.value if s.labels.get("stage") in PULLING_STAGES else 0.0)
        else:
            expired = (expired or 0.0) + s.value
    return TransferFigures(
        held=held,
        pulls=pulls if pulls is not None else fetching,
        expired=expired,
        at=time.monotonic() if at is None else at,
    )


def _source(figure: float | None, sim: str, vllm: str | None = None) -> str:
    if figure is None:
        return NOT_MEASURED
    return sim if vllm is None else f"{sim} or {vllm}"


@dataclass
class TransferReport:
    """What the drain saw of the engine's transfers (the drain report's `transfers`)."""

    role: str
    lease_s: float
    held_at_start: float | None = None
    held_at_end: float | None = None
    pulled: float | None = None  # held blocks released other than by expiry
    timed_out: float | None = None  # held blocks the engine's lease expired (its own counter)
    pulls_at_start: float | None = None
    pulls_at_end: float | None = None
    waited_s: float = 0.0
    bound_s: float | None = None
    bound: str | None = None  # lease | drain_deadline | drain_transfer_wait: what limited the wait
    # clear | bound | not_measured | transfer_wait_passed | metrics_unavailable | skipped: <why>
    ended: str = "not_started"
    source: dict[str, str] = field(default_factory=dict)
    not_measured: list[str] = field(default_factory=list)
    routers_unconfirmed: int = 0  # decode legs the routers could not confirm had reached decode

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TransferWatch:
    """The pure rule of the wait: fed readings, counts releases and says when nothing is left."""

    def __init__(self, side: TransferSide, first: TransferFigures, report: TransferReport) -> None:
        self.side = side
        self.report = report
        self._first = first
        self._last = first
        self._released = 0.0
        report.held_at_start = first.held if side.holds else None
        report.pulls_at_start = first.pulls if side.pulls else None
        report.source = {
            "held": _source(first.held, SIM_KV_TRANSFERS_HELD) if side.holds else "not_applicable",
            "pulls": _source(first.pulls, SIM_KV_PULLS_IN_FLIGHT, KV_FETCH_BY_STAGE)
            if side.pulls
            else "not_applicable",
            "timed_out": _source(first.expired, NIXL_KV_EXPIRED_REQS) if side.holds else "not_applicable",
        }
        if side.holds and first.held is None:
            report.not_measured.append(HELD_NOT_MEASURED)
        if side.pulls and first.pulls is None:
            report.not_measured.append(PULLS_NOT_MEASURED)
        if side.holds and first.expired is None:
            report.not_measured.append(EXPIRED_NOT_MEASURED)

    @property
    def measured(self) -> bool:
        """Whether any figure this engine's role needs is shown."""
        return (self.side.holds and self._first.held is not None) or (
            self.side.pulls and self._first.pulls is not None
        )

    def observe(self, figures: TransferFigures) -> bool:
        """Feed one reading; True when every measured figure is at 0."""
        if figures.held is not None and self._last.held is not None and figures.held < self._last.held:
            self._released += self._last.held - figures.held
        self._last = figures
        held_clear = not self.side.holds or figures.held is None or figures.held <= 0
        pulls_clear = not self.side.pulls or figures.pulls is None or figures.pulls <= 0
        return held_clear and pulls_clear

    def finish(self) -> None:
        r, first, last = self.report, self._first, self._last
        if self.side.holds:
            r.held_at_end = last.held
            if first.expired is not None and last.expired is not None:
                r.timed_out = max(0.0, last.expired - first.expired)
            if last.held is not None:
                r.pulled = max(0.0, self._released - (r.timed_out or 0.0))
        if self.side.pulls:
            r.pulls_at_end = last.pulls


async def _read(session: aiohttp.ClientSession, engine_url: str) -> TransferFigures | None:
    try:
        return read_transfers(await fetch_metrics_text(session, engine_url, within=2.0))
    except (MetricsUnavailable, ValueError):
        return None


async def wait_transfers(
    session: aiohttp.ClientSession,
    engine_url: str,
    side: TransferSide,
    deadline: float,
    transfer_wait: float,
    poll_seconds: float,
    log: Log,
) -> TransferReport:
    """Wait until the engine holds no transfer and pulls none, bounded by its lease (every transfer held
    at the start has been pulled or expired by then) and by `deadline` (time.monotonic(), the drain's),
    whichever first. Nothing measured: wait `transfer_wait` seconds (0: not at all), bounded likewise."""
    report = TransferReport(role=side.role, lease_s=side.lease_seconds)
    started = time.monotonic()
    first = await _read(session, engine_url)
    if first is None:
        report.ended = "metrics_unavailable"
        return report
    watch = TransferWatch(side, first, report)
    unmeasured_held = side.holds and first.held is None
    blind = transfer_wait if unmeasured_held else 0.0
    if watch.measured:
        limit, report.bound = side.lease_seconds + EXPIRY_GRACE_S, "lease"
        if blind > limit:
            limit, report.bound = blind, "drain_transfer_wait"
    else:
        limit, report.bound = blind, "drain_transfer_wait"
    if started + limit >= deadline:
        limit, report.bound = max(0.0, deadline - started), "drain_deadline"
    report.bound_s = round(limit, 3)
    log(
        f"drain: waiting for KV transfers of this {side.role} engine (held {first.held}, pulls "
        f"{first.pulls}; up to {limit:g}s, bound by {report.bound})"
    )
    bound_at = started + limit
    next_log = started + 5.0
    figures: TransferFigures | None = first
    while True:
        now = time.monotonic()
        clear = watch.observe(figures) if figures is not None else False
        if clear and now - started >= blind:
            report.ended = "clear"
            break
        if figures is None:
            report.ended = "metrics_unavailable"
            break
        if now >= bound_at:
            report.ended = "bound"
            break
        if now >= next_log:
            log(
                f"drain: transfers held {figures.held}, pulls {figures.pulls} "
                f"({now - started:.0f}s/{limit:g}s)"
            )
            next_log += 5.0
        await asyncio.sleep(min(poll_seconds, max(0.0, bound_at - now)))
        figures = await _read(session, engine_url)
    watch.finish()
    if report.ended == "clear" and (unmeasured_held or (side.pulls and first.pulls is None)):
        # what was measured is at 0; the rest was waited for blindly, or not at all
        report.ended = "transfer_wait_passed" if blind > 0 else NOT_MEASURED
    report.waited_s = round(time.monotonic() - started, 3)
    log(
        f"drain: KV transfers {report.ended} after {report.waited_s:g}s (held at start "
        f"{report.held_at_start}, pulled {report.pulled}, timed out {report.timed_out}, "
        f"held at end {report.held_at_end}, pulls at end {report.pulls_at_end})"
    )
    return report


def skipped(side: TransferSide, why: str) -> TransferReport:
    """The report of a drain that does not wait for transfers (policy abort or keep)."""
    return TransferReport(role=side.role, lease_s=side.lease_seconds, ended=f"skipped: {why}")
