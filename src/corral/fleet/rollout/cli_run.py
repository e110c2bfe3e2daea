"""What `corral rollout` and `corral rollback` run (corral.fleet.rollout.cli holds their flags): the
CLI around fleet/rollout/groups.py. The fleet is found (`FleetRef`), progress is printed live, the
change record is written whatever the outcome, and the exit code is 0 only when every step and the
post-check passed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
import click
import yaml
from rich.console import Console

from corral.aio import run
from corral.bundle_spec import BundleError, BundleSpec, bundle_from_json, load_bundle, unrecorded_secrets
from corral.clients.access import FleetAccess
from corral.clients.up import UpControlClient
from corral.contracts.records import RolloutRecord
from corral.fleet.checks.change_record import (
    RecordError,
    default_record_path,
    read_change_record,
    read_record,
    write_record,
)
from corral.fleet.local.record_archive import archive_record
from corral.fleet.rollout.base import RolloutBase
from corral.fleet.rollout.canary import CanarySettings
from corral.fleet.rollout.hosts import HostRollout
from corral.fleet.rollout.paired import PairedRollout
from corral.fleet.rollout.progress import StepPrinter, requests_line, summary_line
from corral.fleet.rollout.steps import RolloutJob, RolloutSettings
from corral.fleet_identity import FleetIdentity, FleetIdError, ForeignRecord, check_owner
from corral.state_home import local_fleet_file, read_supervisor_token
from corral.tracing.flag import settings_from_flag
from corral.tracing.provider import start_tracing
from corral.tracing.records import RecordTraces
from corral.tracing.settings import TracingSettings


class FleetRef:
    """Where a Corral-run fleet is. Either a local fleet (`corral up`'s file: router, control API and
    its token_file), or hosts listed with their supervisors:

        router: http://10.0.0.1:8000
        supervisors: [http://10.0.0.2:8081, http://10.0.0.3:8081]
        token_file: /etc/corral/token      # the supervisors' management token (optional on loopback)
    """

    def __init__(
        self,
        router: str,
        port: int,
        control: str | None = None,
        control_token: str | None = None,
        supervisors: list[str] | None = None,
        supervisor_token: str | None = None,
        identity: FleetIdentity | None = None,
    ) -> None:
        self.router, self.port = router, port
        # its fleet id and run (from its fleet file): its records carry them, a rollback checks them
        self.identity = identity or FleetIdentity(None, None, "the fleet file")
        self.control, self.control_token = control, control_token
        self.supervisors, self.supervisor_token = supervisors or [], supervisor_token

    @classmethod
    def load(cls, fleet: Path | None, port: int) -> FleetRef:
        path = fleet or local_fleet_file(port)
        try:
            body = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            hint = "start one with `corral up`, or pass --fleet FILE" if fleet is None else "check the path"
            raise click.UsageError(f"no fleet file {path}: {hint}") from None
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise click.UsageError(f"fleet file {path} is unreadable: {exc}") from None
        if not isinstance(body, dict) or not body.get("router"):
            raise click.UsageError(
                f"fleet file {path}: write a mapping with router and either control + token_file "
                "(a `corral up` fleet) or supervisors (a list of supervisor URLs)"
            )
        router = str(body["router"]).rstrip("/")
        router_port = urlparse(router).port or port
        try:
            identity = FleetIdentity.of_fleet_file(body, str(path))
        except FleetIdError as exc:
            raise click.UsageError(str(exc)) from None
        token = _read_token(body["token_file"]) if body.get("token_file") else None
        if body.get("control"):
            if token is None:
                raise click.UsageError(f"fleet file {path}: a control URL needs its token_file")
            try:  # the fleet's own supervisor token, which `corral up` made for it
                supervisor_token = read_supervisor_token(body, path)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
            return cls(
                router,
                router_port,
                control=str(body["control"]),
                control_token=token,
                supervisor_token=supervisor_token,
                identity=identity,
            )
        supervisors = body.get("supervisors")
        if not isinstance(supervisors, list) or not supervisors:
            raise click.UsageError(
                f"fleet file {path} has neither control (a `corral up` fleet) nor a supervisors list; "
                "rollout needs a fleet whose engines Corral supervises"
            )
        bad = [u for u in supervisors if not str(u).startswith(("http://", "https://"))]
        if bad:
            raise click.UsageError(f"fleet file {path}: supervisors {bad} are not http(s) URLs")
        return cls(
            router,
            router_port,
            supervisors=[str(u) for u in supervisors],
            supervisor_token=token,
            identity=identity,
        )


def _read_token(where: object) -> str:
    path = Path(str(where))
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise click.UsageError(f"token file {path} is unreadable: {exc.strerror or exc}") from None
    if not token:
        raise click.UsageError(f"token file {path} is empty")
    return token


def _execute(
    kind: str,
    target: BundleSpec,
    ref: FleetRef,
    settings: RolloutSettings,
    record_path: Path | None,
    supervisor_token_file: Path | None,
    access: FleetAccess,
    fleet_options: str,
    undoes: Path | None = None,
    tracing: TracingSettings | None = None,
) -> None:
    console = Console(highlight=False, soft_wrap=True)
    token = _read_token(supervisor_token_file) if supervisor_token_file else ref.supervisor_token
    path = record_path or default_record_path(kind, ref.port)
    where = f"{len(ref.supervisors)} hosts, in place" if ref.supervisors else "local fleet"
    console.print(f"{kind} of {ref.router} ({where}) to bundle [bold]{target.name}[/bold]", markup=True)
    observer = StepPrinter(console)

    # the command that undoes this change: a rollback from this very record (it reads `from_bundles`)
    command = f"corral rollback --from-record {shlex.quote(str(path))} {fleet_options}"
    job = RolloutJob(
        ref.router, target, settings, kind, token, access, command, str(undoes) if undoes else None
    )

    async def go() -> RolloutRecord:
        async with aiohttp.ClientSession() as session:
            rollout: RolloutBase
            if ref.control is not None and ref.control_token is not None:
                control = UpControlClient(session, ref.control, ref.control_token)
                rollout = PairedRollout(control, session, job, observer)
            else:
                rollout = HostRollout(ref.supervisors, session, job, observer)
            return await rollout.run()

    record = run(go()).model_copy(update=ref.identity.stamp())  # this fleet's record, and no other's
    if tracing is not None:
        record = _traced(record, tracing)
    _keep_anothers(path, ref.identity, console)
    write_record(path, record)
    console.print(summary_line(record), markup=True)
    console.print(requests_line(record), markup=True)
    console.print(f"change record: {path}")
    raise SystemExit(0 if record.outcome == "succeeded" else 1)


def _traced(record: RolloutRecord, settings: TracingSettings) -> RolloutRecord:
    """The record as a trace (a span per group step), exported before the command exits (a bounded
    flush: a collector that is down costs the rollout nothing but this trace)."""
    tracing = start_tracing(settings)
    try:
        return RecordTraces(tracing.tracer("corral.rollout")).traced(record)
    finally:
        tracing.close()


def _keep_anothers(path: Path, fleet: FleetIdentity, console: Console) -> None:
    """A record of another fleet where this one's goes is moved into the runs archive, not overwritten."""
    body = read_record(path)
    if body is None:
        return
    try:
        check_owner(body, str(path), fleet, "")
    except ForeignRecord:
        try:
            where = archive_record(path.parent, path)
        except OSError as exc:
            console.print(f"warning: replacing {path}, another fleet's record ({exc.strerror or exc})")
            return
        console.print(f"{path} was another fleet's record: archived as {where}", markup=False)


def _fleet_options(fleet: Path | None, port: int) -> str:
    """The options that name this fleet again, for the record's rollback command."""
    return f"--fleet {shlex.quote(str(fleet))}" if fleet is not None else f"--port {port}"


@dataclass(frozen=True)
class ChangeFlags:
    """The flags `corral rollout` and `corral rollback` share: which fleet, how to move it, where the
    record goes."""

    fleet: Path | None
    port: int
    max_surge: int
    max_unavailable: int
    routed_timeout: float
    start_timeout: float
    min_prefill: int
    min_decode: int
    record: Path | None
    supervisor_token_file: Path | None
    access: FleetAccess
    canary: CanarySettings
    otlp_traces_endpoint: str | None = None

    def settings(self) -> RolloutSettings:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise click.UsageError("--max-surge 0 needs --max-unavailable of at least 1 (or nothing moves)")
        return RolloutSettings(
            max_surge=self.max_surge,
            max_unavailable=self.max_unavailable,
            routed_timeout=self.routed_timeout,
            start_timeout=self.start_timeout,
            canary=self.canary,
            min_prefill=self.min_prefill,
            min_decode=self.min_decode,
        )

    def execute(
        self,
        kind: str,
        target: BundleSpec,
        ref: FleetRef,
        settings: RolloutSettings,
        undoes: Path | None = None,
    ) -> None:
        options = _fleet_options(self.fleet, self.port)
        tracing = settings_from_flag(self.otlp_traces_endpoint, "corral-rollout")  # refused before it runs
        _execute(
            kind,
            target,
            ref,
            settings,
            self.record,
            self.supervisor_token_file,
            self.access,
            options,
            undoes,
            tracing,
        )


def run_rollout(to: Path, flags: ChangeFlags) -> None:
    """A rollout as its flags describe it."""
    try:
        target = load_bundle(to)
    except BundleError as exc:
        raise click.UsageError(str(exc)) from None
    settings = flags.settings()  # bad settings are refused before the fleet is looked up
    flags.execute("rollout", target, FleetRef.load(flags.fleet, flags.port), settings)


def run_rollback(from_record: Path | None, flags: ChangeFlags) -> None:
    """A rollback as its flags describe it."""
    ref = FleetRef.load(flags.fleet, flags.port)
    source = from_record or default_record_path("rollout", ref.port)
    try:
        previous = read_change_record(source)
    except RecordError as exc:
        raise click.UsageError(f"{exc}; pass --from-record PATH") from None
    if previous is None:
        raise click.UsageError(f"no change record {source}: roll out first, or pass --from-record PATH")
    if not isinstance(previous, RolloutRecord):
        raise click.UsageError(
            f"{source} is a {previous.kind} record, not a rollout's (or a rollback's); "
            "pass --from-record PATH"
        )
    try:  # undo only a change made to this fleet: a record an earlier fleet on this port left is not
        check_owner(
            read_record(source) or {},
            str(source),
            ref.identity,
            "a rollback undoes a change of this fleet only; to move this fleet to a bundle, run "
            "`corral rollout --to BUNDLE.yaml`",
        )
    except ForeignRecord as exc:
        raise click.UsageError(str(exc)) from None
    bundles = {str(b): b for b in previous.from_bundles.values() if b}
    if len(bundles) != 1:
        raise click.UsageError(
            f"{source}: the {previous.kind} started from {len(bundles)} bundles, not one; "
            "roll out to the one you want with `corral rollout --to`"
        )
    try:
        target = bundle_from_json(next(iter(bundles.values())), str(source))
    except BundleError as exc:
        raise click.UsageError(str(exc)) from None
    masked = unrecorded_secrets(target)
    if masked:  # a record keeps no secret; the engines would start with "<redacted>" for a value
        raise click.UsageError(
            f"{source}: bundle {target.name!r} set {', '.join(masked)}, whose values a record does not "
            "keep; roll back with `corral rollout --to BUNDLE.yaml` naming that bundle's file"
        )
    flags.execute("rollback", target, ref, flags.settings(), source)
