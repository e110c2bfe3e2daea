"""The `corral router --flow-*` flags, handed to the command as one `flow: FlowConfig | None` argument
(None unless --flow-control). Only click and the settings here, so that `corral router --help` starts
fast."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import click

from corral.router.flow.config import MAX_PRIORITY, MIN_PRIORITY, FlowConfig

_BAND_TTL = re.compile(r"^\s*([+-]?[0-9]{1,4})\s*=\s*([0-9]{1,6}(?:\.[0-9]{1,3})?)\s*$")


def parse_band_ttls(values: tuple[str, ...]) -> dict[int, float]:
    """`PRIORITY=SECONDS` pairs (`--flow-band-ttl 10=5`); ValueError naming the bad one."""
    ttls: dict[int, float] = {}
    for value in values:
        match = _BAND_TTL.match(value)
        if match is None or not MIN_PRIORITY <= int(match.group(1)) <= MAX_PRIORITY:
            raise ValueError(
                f"--flow-band-ttl {value[:40]!r}: write PRIORITY=SECONDS, a priority from {MIN_PRIORITY} "
                f"to {MAX_PRIORITY} and at most 999999 seconds, e.g. 10=5"
            )
        seconds = float(match.group(2))
        if seconds <= 0:
            raise ValueError(f"--flow-band-ttl {value!r}: the seconds must be more than 0")
        ttls[int(match.group(1))] = seconds
    return ttls


def flow_options(command: Callable[..., None]) -> Callable[..., None]:
    defaults = FlowConfig()

    @functools.wraps(command)
    def with_flow(
        *args: Any,
        flow_control: bool,
        flow_engine_max_in_flight: int,
        flow_max_waiting: int,
        flow_max_kv_usage: float,
        flow_queue_ttl: float,
        flow_band_ttl: tuple[str, ...],
        flow_max_queue: int,
        flow_max_queue_per_tenant: int,
        flow_order: str,
        flow_slot_shares: bool,
        flow_share_window: float,
        **kwargs: Any,
    ) -> None:
        try:
            band_ttls = parse_band_ttls(flow_band_ttl)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--flow-band-ttl") from None
        flow = (
            FlowConfig(
                engine_max_in_flight=flow_engine_max_in_flight,
                max_waiting=flow_max_waiting,
                max_kv_usage=flow_max_kv_usage,
                ttl_seconds=flow_queue_ttl,
                band_ttl_seconds=band_ttls,
                max_queue=flow_max_queue,
                max_queue_per_flow=flow_max_queue_per_tenant,
                order="edf" if flow_order == "edf" else "fcfs",
                slot_shares=flow_slot_shares,
                share_window_seconds=flow_share_window,
            )
            if flow_control
            else None
        )
        command(*args, flow=flow, **kwargs)

    options = [
        click.option(
            "--flow-control/--no-flow-control",
            default=False,
            show_default=True,
            help="Hold requests in the router while every eligible engine of their model is saturated "
            "(--flow-engine-max-in-flight, --flow-max-waiting, --flow-max-kv-usage), in priority bands "
            "(the tenants' `priority`, x-corral-priority up to their `max_priority`), shared among "
            "tenants by `weight`, and send them on as room comes back. docs/flow-control.md.",
        ),
        click.option(
            "--flow-engine-max-in-flight",
            default=defaults.engine_max_in_flight,
            show_default=True,
            type=click.IntRange(0, 1_000_000),
            help="Flow control: an engine with this many requests open from this host's router "
            "(all its --workers) is saturated; set it to the engine's --max-num-seqs. 0: judge by the "
            "engine's own figures alone.",
        ),
        click.option(
            "--flow-max-waiting",
            default=defaults.max_waiting,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="Flow control: an engine whose /metrics show this many requests waiting is saturated "
            "until one it had open then ends or fresher figures come (read every scrape interval).",
        ),
        click.option(
            "--flow-max-kv-usage",
            default=defaults.max_kv_usage,
            show_default=True,
            type=click.FloatRange(0.0, 1.0, min_open=True),
            help="Flow control: an engine whose KV-cache use (0-1) is at least this is saturated, "
            "as for --flow-max-waiting.",
        ),
        click.option(
            "--flow-queue-ttl",
            default=defaults.ttl_seconds,
            show_default=True,
            type=click.FloatRange(0.0, 86_400.0, min_open=True),
            help="Flow control: seconds a request may wait in the queue; then 429 with Retry-After.",
        ),
        click.option(
            "--flow-band-ttl",
            multiple=True,
            metavar="PRIORITY=SECONDS",
            help="Flow control: the queue TTL of one priority band (repeatable), e.g. 10=5.",
        ),
        click.option(
            "--flow-max-queue",
            default=defaults.max_queue,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="Flow control: requests waiting at most, all models; one more is 429, unless it "
            "displaces a request of a lower band.",
        ),
        click.option(
            "--flow-max-queue-per-tenant",
            default=defaults.max_queue_per_flow,
            show_default=True,
            type=click.IntRange(1, 1_000_000),
            help="Flow control: requests of one tenant (an open router: one x-corral-fairness-id) "
            "waiting at most; one more is 429.",
        ),
        click.option(
            "--flow-order",
            type=click.Choice(["fcfs", "edf"]),
            default=defaults.order,
            show_default=True,
            help="Flow control: the order of one tenant's waiting requests: first come first served, or "
            "earliest deadline first (x-corral-deadline-ms, else the tenant's deadline_ms; none: last).",
        ),
        click.option(
            "--flow-slot-shares/--no-flow-slot-shares",
            default=defaults.slot_shares,
            show_default=True,
            help="Flow control with --flow-engine-max-in-flight: while several tenants of a band are "
            "active, each holds at most its weighted share of the model's slots, so a slot is free when "
            "a light tenant's request comes (a flood waits beside free slots; alone, a tenant uses them "
            "all). Off: any tenant fills every free slot, and the others wait for the next to end.",
        ),
        click.option(
            "--flow-share-window",
            default=defaults.share_window_seconds,
            show_default=True,
            type=click.FloatRange(0.0, 3600.0),
            help="Flow control: seconds a tenant still counts as active for --flow-slot-shares after its "
            "last request ended.",
        ),
    ]
    decorated: Callable[..., None] = with_flow
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
