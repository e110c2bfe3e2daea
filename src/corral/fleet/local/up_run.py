"""What `corral up` runs (corral.fleet.local.up holds its flags): a local fleet of simulated engines
behind a router.

Before anything starts it checks the state dir and the router port, and claims the port's fleet
files (`corral.fleet.local.ownership`), so a second `up` on a port in use changes nothing; every fleet
gets its own supervisor management token (0600), which its supervisors want and its router sends.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import aiohttp
import click
import orjson
from rich.console import Console

from corral.aio import run
from corral.bundle_spec import BundleError, load_bundle
from corral.clients.access import RouterAdminError
from corral.fleet.checks.status import fetch_fleet, summary_line
from corral.fleet.local.control import FleetControl, write_token_file
from corral.fleet.local.fleet import NO_LOCAL_DAEMON, FleetSpec, LocalFleet
from corral.fleet.local.fleet_config import FleetConfigError, config_bundle, load_fleet_config, up_values
from corral.fleet.local.ownership import FleetFiles, FleetInUse
from corral.fleet.local.ports import port_problem
from corral.fleet.local.record_archive import archive_fleet_records, archive_port_records
from corral.fleet.local.roles import RoleCountError, role_groups
from corral.fleet_identity import FleetIdentity
from corral.state_home import corral_state_dir, state_dir_problem
from corral.supervisor.lifecycle.config import is_loopback


def up_fleet(
    engines: int | None,
    prefill: int,
    decode: int,
    port: int,
    host: str,
    model: str,
    policy: str,
    startup_timeout: float,
    stop_grace: float,
    log_dir: Path | None,
    verbose: bool,
    sim_args: tuple[str, ...],
    router_args: tuple[str, ...],
    group_size: int,
    bundle_file: Path | None,
    drain_timeout: float,
    no_gate: bool,
    no_sleep_mode: bool,
    config_file: Path | None,
    preload: bool = False,
) -> None:
    """Start the fleet the flags (and --config) describe and watch it until Ctrl-C."""
    console = Console(highlight=False, soft_wrap=True)
    bundle = None
    if config_file is not None:
        ctx = click.get_current_context()
        try:
            config, given = load_fleet_config(config_file)
            bundle = config_bundle(config, config_file)
        except FleetConfigError as exc:
            raise click.UsageError(str(exc)) from None
        from_file = up_values(config, config_file, given)
        if any(_typed(ctx, k) for k in ("engines", "prefill", "decode")):  # the command line's counts
            from_file = {k: v for k, v in from_file.items() if k not in ("engines", "prefill", "decode")}
        p = {**ctx.params, **{k: v for k, v in from_file.items() if not _typed(ctx, k)}}
        if sim_args:  # --sim-arg on the command line replaces the file's bundle
            bundle = None
        engines, prefill, decode, group_size = p["engines"], p["prefill"], p["decode"], p["group_size"]
        port, host, model, policy = p["port"], p["host"], p["model"], p["policy"]
        drain_timeout, no_gate, no_sleep_mode = p["drain_timeout"], p["no_gate"], p["no_sleep_mode"]
        startup_timeout, stop_grace, router_args = p["startup_timeout"], p["stop_grace"], p["router_args"]
    if engines is not None and (prefill or decode):
        raise click.UsageError(
            "use either --engines N (engines that do prefill and decode) or --prefill N --decode M "
            "(a disaggregated fleet), not both"
        )
    engines = prefill + decode if prefill or decode else engines or 2
    try:
        role_groups(engines, prefill, decode, group_size)
    except RoleCountError as exc:
        raise click.UsageError(str(exc)) from None
    if bundle_file is not None:
        if sim_args:
            raise click.UsageError("Use either --bundle or --sim-arg: a bundle names its engine_args.")
        try:
            bundle = load_bundle(bundle_file)
        except BundleError as exc:
            raise click.UsageError(str(exc)) from None
    if bundle is not None and bundle.preload_command:
        raise click.UsageError(NO_LOCAL_DAEMON)
    spec = FleetSpec(
        engines=engines,
        host=host,
        router_port=port,
        model=model,
        policy=policy,
        startup_timeout=startup_timeout,
        stop_grace=stop_grace,
        sim_args=sim_args,
        router_args=router_args,
        group_size=group_size,
        bundle=bundle,
        drain_timeout=drain_timeout,
        gate=not no_gate,
        # development endpoints only where nothing beyond loopback reaches the engine
        runbook_ready=not no_sleep_mode and (not no_gate or is_loopback(host)),
        prefill=prefill,
        decode=decode,
        preload=preload,
    )
    files = _preflight(host, port)
    try:
        note = files.claim()
    except FleetInUse as exc:
        _bad_input(str(exc))
    fleet: LocalFleet | None = None
    try:
        if note is not None:
            console.print(note, markup=False)
        try:
            write_token_file(files.supervisor_token_file)
        except OSError as exc:
            _bad_input(f"cannot write {files.supervisor_token_file}: {exc.strerror or exc}")
        _archive_records(files, console, "the earlier fleets'")
        logs = log_dir or Path(tempfile.mkdtemp(prefix="corral-up-"))
        echo = (lambda line: console.print(line, markup=False)) if verbose else None
        identity = FleetIdentity.new(str(files.fleet_file))
        fleet = LocalFleet(spec, logs, files.fleet_file, echo, files.supervisor_token_file, identity)
        console.print(f"fleet id: {identity.id} (run {identity.run})", markup=False)
        code = run(_up(fleet, files.control_token_file, console))
    finally:
        # before the lock goes: the next fleet on this port starts with none of this one's records
        _archive_records(files, console, "this fleet's", fleet)
        files.release()  # ours: claimed above, so no other fleet's files
    raise SystemExit(code)


def _archive_records(
    files: FleetFiles, console: Console, whose: str, fleet: LocalFleet | None = None
) -> None:
    """Move the port's change records (and those `fleet`'s supervisors kept) into the runs archive,
    saying where; a failure is a warning."""
    try:
        moved = archive_port_records(files.state_dir, files.port)
        if fleet is not None and fleet.identity.id is not None:
            moved += archive_fleet_records(files.state_dir, fleet.supervisor_ports, fleet.identity.id)
    except OSError as exc:
        console.print(
            f"warning: could not archive the change records of port {files.port} "
            f"({exc.strerror or exc}); move {files.state_dir}/*-{files.port}.json away yourself",
            markup=False,
        )
        return
    if moved:
        console.print(f"archived {whose} change records: {', '.join(map(str, moved))}", markup=False)


def _typed(ctx: click.Context, name: str) -> bool:
    """Whether the user gave this option on the command line (it then wins over --config)."""
    return ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE


def _bad_input(message: str) -> NoReturn:
    click.echo(f"corral up: {message}", err=True)
    sys.exit(2)


def _preflight(host: str, port: int) -> FleetFiles:
    """Before anything starts: a state dir that can be used and a router port nobody holds; a
    second fleet on a port in use is refused here, before it touches any file."""
    state_dir = corral_state_dir()
    if (problem := state_dir_problem(state_dir)) is not None:
        _bad_input(
            f"state dir {state_dir} cannot be used: {problem}; set XDG_STATE_HOME to a directory "
            "this user can write"
        )
    if (problem := port_problem(host, port)) is not None:
        _bad_input(problem)
    return FleetFiles(state_dir, port)


async def _up(fleet: LocalFleet, token_file: Path, console: Console) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    spec = fleet.spec
    groups = f" in {spec.groups} serving groups" if spec.group_size > 1 else ""
    engines = f"{spec.prefill} prefill and {spec.decode} decode" if spec.prefill else str(spec.engines)
    console.print(f"starting {engines} simulated engine(s){groups} and a router (logs: {fleet.log_dir})")
    started = time.monotonic()
    start_task = asyncio.create_task(fleet.start())
    stop_task = asyncio.create_task(stop.wait())
    await asyncio.wait({start_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    if not start_task.done():
        start_task.cancel()
        console.print("interrupted while starting; stopping")
        await _stop(fleet, console)
        return 130
    stop_task.cancel()
    if (error := start_task.exception()) is not None:
        console.print(f"[red]fleet failed to start:[/red] {error}", markup=True)
        await _stop(fleet, console)
        return 1
    control = FleetControl(fleet, write_token_file(token_file))
    fleet.set_control(
        await control.start(spec.host if spec.host.startswith("127.") else "127.0.0.1"), token_file
    )
    url = fleet.router_url
    console.print(f"[green]fleet ready[/green] in {time.monotonic() - started:.1f}s")
    console.print(f"router: [bold]{url}[/bold]   dashboard: [bold]{url}/dashboard[/bold]")
    body = orjson.dumps({"model": spec.model, "messages": [{"role": "user", "content": "Hello"}]}).decode()
    console.print(
        f"try:    curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'",
        markup=False,
    )
    first = fleet.engines[0].name if fleet.engines else "engine-0"
    console.print(f"status: corral status --port {spec.router_port}")
    if spec.bundle is not None or spec.runbook_ready:
        console.print(
            f"sleep:  corral sleep --port {spec.router_port} --engine {first}   (and wake, reload, logs)"
        )
    console.print("Ctrl-C stops everything.")
    try:
        code = await _watch(fleet, console, stop)
    finally:
        await control.stop()
        await _stop(fleet, console)
    return code


async def _watch(fleet: LocalFleet, console: Console, stop: asyncio.Event) -> int:
    """Print the fleet's status when it changes (and every 30 s) until stopped or a member dies."""
    last_line, last_print = "", 0.0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            if dead := fleet.exited():
                for m in dead:
                    tail = "\n".join(list(m.process.last_lines)[-10:])
                    console.print(
                        f"[red]{m.name} exited with code {m.process.returncode}[/red] "
                        f"(log: {m.log_path})\n{tail}",
                        markup=True,
                    )
                return 1
            try:
                names = {m.engine_url: m.name for m in fleet.engines}
                line = summary_line(await fetch_fleet(session, fleet.router_url), names)
            except RouterAdminError as exc:
                line = str(exc)
            now = time.monotonic()
            if line != last_line or now - last_print >= 30:
                console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {line}", markup=True)
                last_line, last_print = line, now
            try:
                await asyncio.wait_for(stop.wait(), 2.0)
            except TimeoutError:
                pass
    return 0


async def _stop(fleet: LocalFleet, console: Console) -> None:
    console.print("stopping router, then engines …")
    codes = await fleet.stop()
    said = {0: "exited cleanly", None: "no exit code"}
    console.print(
        "stopped: "
        + ", ".join(f"{name} ({said.get(code, f'exit code {code}')})" for name, code in codes.items())
    )
