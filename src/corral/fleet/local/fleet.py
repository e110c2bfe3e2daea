"""The local fleet behind `corral up`: N simulated engines, each under its own `corral supervise`, and
one router, as child processes on loopback.

Engines come in serving groups (`--group-size`, default 1): a group is started whole from one bundle
and retired whole, never changed member by member, so a group never mixes bundles. `add_group` and
`retire_group` are what `corral rollout` drives through the fleet's control API (fleet/local/control.py).
A disaggregated fleet (`--prefill N --decode M`) has groups of each role (fleet/local/roles.py).

Each supervisor runs its admission gate (`corral supervise --gate-port`) in front of an engine bound
to loopback, and the gate's URL is the engine URL the rest of the fleet reaches (the router's
backends, the fleet file, the control API's members): every request passes the gate, which names
the requests a drain's deadline cuts (`--no-gate` on `corral up`: the engine itself is the URL).
Unless given a bundle, the engines start runbook-ready: with sleep mode and the development endpoints
the supervisor's sleep, wake and reload use, which the gate keeps off the network.

The router reads the fleet's backends file (`ENGINE_URL=SUPERVISOR_URL` per engine, and
`group=NAME/SIZE` for the members of a group of more than one engine, which the router routes to
only while the whole group is READY on one bundle) and follows every supervisor's state stream, so a
drain of one engine is acknowledged by the router before the engine's in-flight work is touched, and
the fleet changes the router's members by rewriting that file.

It owns start order (supervised engines, then the router once every supervisor reports READY),
readiness waits with deadlines, the fleet file `corral status` reads (with every process of the
fleet and the supervisors' token file), and a stop that leaves no process behind whatever a child
does. Which `up` may write and remove the fleet's files is `corral.fleet.local.ownership`'s business.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from corral.atomic_file import write_atomically
from corral.bundle_spec import BundleSpec
from corral.child_process import ChildProcess, LineSink
from corral.fleet.local.adapters import AdapterCarryFailed, carry_adapters, desired_adapters
from corral.fleet.local.kv_events import kv_events_args
from corral.fleet.local.ownership import RecordedProcess
from corral.fleet.local.ports import free_port, reserve
from corral.fleet.local.preload import engine_daemon
from corral.fleet.local.roles import (
    engine_args_for,
    role_groups,
    role_marker,
    supervisor_args_for,
)
from corral.fleet_identity import FleetIdentity

LOOPBACK = "127.0.0.1"
SLEEP_MODE_FLAG = "--enable-sleep-mode"  # vLLM's, which the simulator takes too
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's switch for /sleep, /wake_up, /is_sleeping, /reset_prefix_cache


# a local fleet's daemons are its own (`corral up --preload`: one per engine, on its own port and socket,
# local/preload.py); a bundle's preload_command, one fixed command, would be ignored, so it is refused
NO_LOCAL_DAEMON = (
    "bundle.preload_command: a local fleet runs no bundle's daemon (with `corral up --preload` it gives "
    "each engine its own, on the bundle's --version-string); give engine_args only, or declare the "
    "bundle on hosts run with `corral supervise --preload-command` and roll out across them"
)


class FleetStartError(RuntimeError):
    """A fleet member did not come up; the message names it and says why."""


@dataclass(frozen=True)
class FleetSpec:
    engines: int = 2
    host: str = "127.0.0.1"
    router_port: int = 8000
    model: str = "sim-model"
    policy: str = "least_request"
    startup_timeout: float = 60.0
    stop_grace: float = 30.0
    sim_args: tuple[str, ...] = ()
    group_size: int = 1
    bundle: BundleSpec | None = None  # the bundle to start with; None: "initial", from sim_args
    # the supervisor's drain on stop: short, because a local fleet's router stops first
    propagation_timeout: float = 2.0
    quiet_period: float = 0.5
    drain_timeout: float = 10.0
    engine_shutdown_timeout: float = 5.0
    router_args: tuple[str, ...] = ()  # extra `corral router` flags, e.g. --slow-start-seconds
    gate: bool = True  # each supervisor's admission gate is the engine URL clients reach
    # a disaggregated fleet (`corral up --prefill N --decode M`): engines of each role, 0: none
    prefill: int = 0
    decode: int = 0
    preload: bool = False  # `corral up --preload`: each engine loads from its own daemon (local/preload.py)

    # the default bundle is runbook-ready: the simulator with sleep mode and its development endpoints
    # (which the supervisor's sleep, wake and reload call), reachable only on loopback behind the gate
    runbook_ready: bool = True

    @property
    def initial_bundle(self) -> BundleSpec:
        if self.bundle is not None:
            return self.bundle
        if not self.runbook_ready:
            return BundleSpec(name="initial", engine_args=self.sim_args)
        args = self.sim_args
        # vLLM refuses sleep mode for weights loaded from a preload daemon (--load-format ipc_cache)
        if SLEEP_MODE_FLAG not in args and "ipc_cache" not in " ".join(args) and not self.preload:
            args = (SLEEP_MODE_FLAG, *args)
        return BundleSpec(name="initial", engine_args=args, env={DEV_MODE_ENV: "1"})

    @property
    def groups(self) -> int:
        return max(1, self.engines // self.group_size)

    @property
    def role_groups(self) -> list[tuple[str, int]]:
        """(role, serving groups of it) the fleet starts with."""
        return role_groups(self.engines, self.prefill, self.decode, self.group_size)


@dataclass
class Member:
    """One process of the fleet: `url` is what the rest of the fleet talks to (for an engine, the
    supervisor's probes and management API; the engine answers at `engine_url`: its supervisor's
    admission gate, or the engine itself without one)."""

    name: str
    url: str
    process: ChildProcess
    log_path: Path
    engine_url: str = ""
    group: str = ""
    role: str = "both"  # prefill | decode | both (corral.engine.pd_protocol.ROLES)
    bundle: BundleSpec | None = None
    adapters: list[str] = field(default_factory=list)  # what the engine served once its group was added
    started_at: float = field(default_factory=time.monotonic)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "role": self.role,
            "supervisor": self.url,
            "engine": self.engine_url,
            "pid": self.process.pid,
            "running": self.process.running,
            "bundle": self.bundle.to_json() if self.bundle else None,
            "adapters": list(self.adapters),
            "log": str(self.log_path),
        }


def _file_sink(path: Path, echo: LineSink | None) -> LineSink:
    fh = path.open("a", buffering=1, encoding="utf-8")

    def sink(line: str) -> None:
        fh.write(line + "\n")
        if echo is not None:
            echo(line)

    return sink


class LocalFleet:
    """Starts, watches and stops the processes of one local fleet."""

    def __init__(
        self,
        spec: FleetSpec,
        log_dir: Path,
        fleet_file: Path,
        echo: LineSink | None = None,
        supervisor_token_file: Path | None = None,
        identity: FleetIdentity | None = None,
    ) -> None:
        self.spec = spec
        # its fleet id and run, in its fleet file and so in every change record made against it
        self.identity = identity or FleetIdentity.new(str(fleet_file))
        self.log_dir = log_dir
        self.fleet_file = fleet_file
        # the supervisors' management token: every supervisor wants it, the router sends it
        self.supervisor_token_file = supervisor_token_file
        self._started = RecordedProcess.of("up", os.getpid())
        self.backends_file = log_dir / "backends"
        self._echo = echo
        self.engines: list[Member] = []
        # started but not yet serving, or drained and being stopped: stopped with the fleet, but
        # their exit is no reason to take the fleet down
        self._transient: list[Member] = []
        self.router: Member | None = None
        self.control_url: str | None = None
        self.token_file: Path | None = None
        self._next_engine = 0
        # every supervisor port the fleet ever ran (retired groups' too): where `corral sleep|wake|…`
        # kept their records (`KIND-SUPERVISORPORT.json`), archived with the fleet's own
        self.supervisor_ports: set[int] = set()
        self._sockets: Path | None = None  # `--preload`: the daemons' socket dirs, removed at stop
        self._next_group = 0
        reserve(spec.router_port)  # the router binds it after the engines start: none of them gets it

    @property
    def router_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.router_port}"

    @property
    def members(self) -> list[Member]:
        return [*self.engines, *([self.router] if self.router else [])]

    def groups(self) -> dict[str, list[Member]]:
        """Serving group name -> its engines, in start order."""
        found: dict[str, list[Member]] = {}
        for member in self.engines:
            found.setdefault(member.group, []).append(member)
        return found

    def _spawn(
        self, name: str, url: str, args: list[str], engine_url: str = "", env: dict[str, str] | None = None
    ) -> Member:
        log_path = self.log_dir / f"{name}.log"
        argv = [sys.executable, "-m", "corral", *args]
        sink = _file_sink(log_path, self._echo_for(name))
        return Member(name, url, ChildProcess(name, argv, env=env, sink=sink), log_path, engine_url)

    def _supervised_engine(self, bundle: BundleSpec, group: str, role: str) -> Member:
        spec, host = self.spec, self.spec.host
        i = self._next_engine
        self._next_engine += 1
        # behind a gate the engine listens on loopback only: its dev endpoints stay off the network
        engine_host = LOOPBACK if spec.gate else host
        engine_port, supervisor_port = free_port(engine_host), free_port(host)
        self.supervisor_ports.add(supervisor_port)
        engine_url = f"http://{engine_host}:{engine_port}"
        sim = [sys.executable, "-m", "corral", "sim", "--host", engine_host, "--port", str(engine_port)]
        sim += ["--model", spec.model, "--seed", str(i), *engine_args_for(role, bundle.engine_args)]
        if spec.policy == "prefix":  # the router places requests by what each engine's cache holds
            sim += kv_events_args(self.log_dir, f"engine-{i}", bundle.engine_args)
        args = ["supervise", "--host", host, "--port", str(supervisor_port), "--engine-url", engine_url]
        if spec.preload:  # its own daemon, on the bundle's vLLM, before the engine
            self._sockets = self._sockets or Path(tempfile.mkdtemp(prefix="corral-wc-"))
            daemon = engine_daemon(bundle, spec.model, self._sockets)
            sim += daemon.engine_args
            args += daemon.supervisor_args
        if spec.gate:
            gate_port = free_port(host)
            args += ["--gate-port", str(gate_port), "--gate-host", host]
            engine_url = f"http://{host}:{gate_port}"
        args += ["--model", spec.model, "--state-dir", str(self.log_dir / f"engine-{i}.state")]
        args += ["--bundle-name", bundle.name]  # what its state stream names it (the router's dashboard)
        args += ["--propagation-timeout", str(spec.propagation_timeout)]
        args += ["--quiet-period", str(spec.quiet_period), "--drain-timeout", str(spec.drain_timeout)]
        args += ["--shutdown-timeout", str(spec.engine_shutdown_timeout)]
        if self.supervisor_token_file is not None:
            args += ["--token-file", str(self.supervisor_token_file)]
        if bundle.fingerprint is not None:  # the fleet pins what its bundle says: PRECHECK refuses another
            args += ["--expect-fingerprint", bundle.fingerprint]
        args += [*supervisor_args_for(role), "--", *sim]
        member = self._spawn(
            f"engine-{i}", f"http://{host}:{supervisor_port}", args, engine_url, env=dict(bundle.env) or None
        )
        member.group, member.bundle, member.role = group, bundle, role
        return member

    def _write_backends_file(self) -> None:
        """What the router routes to: every serving engine with its supervisor, in a group of more
        than one its group marker, and a prefill or decode engine's role marker (atomic rename)."""
        sizes = {name: len(members) for name, members in self.groups().items()}
        lines = [
            f"{m.engine_url}={m.url}{f' group={m.group}/{sizes[m.group]}' if sizes[m.group] > 1 else ''}"
            f"{role_marker(m.role)} name={m.name}  # {m.group}"
            for m in self.engines
        ]
        write_atomically(self.backends_file, ("\n".join(lines) + "\n").encode())

    def _write_fleet_file(self) -> None:
        """Where `corral status`, `verify`, `doctor` and `rollout` find this fleet."""
        body = {
            "router": self.router_url,
            **self.identity.stamp(),
            "pid": os.getpid(),
            # every process of the fleet: while one runs, no other `up` deletes or rewrites this file
            "processes": [
                self._started.to_json(),
                *(RecordedProcess.of(name, pid).to_json() for name, pid in self._member_pids()),
            ],
            "supervisor_token_file": str(self.supervisor_token_file) if self.supervisor_token_file else None,
            "logs": str(self.log_dir),
            "control": self.control_url,
            "token_file": str(self.token_file) if self.token_file else None,
            "group_size": self.spec.group_size,
            "engines": [
                {
                    "name": m.name,
                    "supervisor": m.url,
                    "engine": m.engine_url,
                    "group": m.group,
                    "role": m.role,
                    "bundle": m.bundle.name if m.bundle else None,
                }
                for m in self.engines
            ],
        }
        write_atomically(self.fleet_file, orjson.dumps(body, option=orjson.OPT_INDENT_2))

    def _member_pids(self) -> list[tuple[str, int]]:
        members = [*self.members, *self._transient]
        return [(m.name, m.process.pid) for m in members if m.process.pid is not None]

    def set_control(self, url: str, token_file: Path) -> None:
        self.control_url, self.token_file = url, token_file
        self._write_fleet_file()

    def _echo_for(self, name: str) -> LineSink | None:
        echo = self._echo
        if echo is None:
            return None
        return lambda line: echo(f"[{name}] {line}")

    async def start(self) -> None:
        """Start every serving group, wait until each supervisor reports READY (the engine answered
        and passed its smoke request), then start the router and wait for it."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        groups = [
            self._new_group(spec.initial_bundle, spec.group_size, role)
            for role, count in spec.role_groups
            for _ in range(count)
        ]
        for group in groups:
            for member in group:
                await member.process.start()
                self.engines.append(member)
        self._write_backends_file()
        self._write_fleet_file()
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._wait_healthy(session, m, "/readyz") for m in self.engines))
            router_args = ["router", "--host", spec.host, "--port", str(spec.router_port)]
            router_args += ["--policy", spec.policy, "--router-id", "local-router"]
            if spec.policy == "prefix":  # hash prompts into blocks as the simulated engines do
                router_args += ["--tokenizer", "sim"]
            # one router process (a local fleet is small, and `corral status` reads one /v1/fleet);
            # --router-arg=--workers=N comes after and wins
            router_args += ["--workers", "1"]
            # each engine with its supervisor: routed only while it says READY, each drain confirmed
            router_args += ["--backends-file", str(self.backends_file), "--models-refresh-seconds", "1"]
            if self.supervisor_token_file is not None:
                router_args += ["--supervisor-token-file", str(self.supervisor_token_file)]
            router_args += list(spec.router_args)
            self.router = self._spawn("router", self.router_url, router_args)
            await self.router.process.start()
            self._write_fleet_file()
            await self._wait_healthy(session, self.router, "/health")

    def _new_group(self, bundle: BundleSpec, size: int, role: str = "both") -> list[Member]:
        name = f"g{self._next_group}"
        self._next_group += 1
        return [self._supervised_engine(bundle, name, role) for _ in range(size)]

    async def add_group(
        self,
        bundle: BundleSpec,
        size: int | None = None,
        startup_timeout: float | None = None,
        adapters: dict[str, str] | None = None,
        role: str = "both",
    ) -> list[Member]:
        """Start a new serving group of `role` from `bundle`; once every member is READY and serves `adapters`
        (name -> path; None: the union of the serving groups' desired sets), hand it to the router.
        All or nothing: if one member fails, or an adapter will not load, every member started is
        stopped and FleetStartError says which and why."""
        group = self._new_group(bundle, size or self.spec.group_size, role)
        self._transient += group
        token = self.supervisor_token_file.read_text().strip() if self.supervisor_token_file else None
        try:
            for member in group:
                await member.process.start()
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(
                    *(self._wait_healthy(session, m, "/readyz", startup_timeout) for m in group)
                )
                try:
                    if adapters is None:
                        adapters = await desired_adapters(
                            session, [(m.name, m.url) for m in self.engines], token
                        )
                    members = [(m.name, m.url) for m in group]
                    served = await carry_adapters(session, members, adapters, token, f"add-{group[0].group}")
                except AdapterCarryFailed as exc:
                    raise FleetStartError(f"{group[0].group} on {bundle.name}: {exc}") from None
            for member in group:
                member.adapters = served.get(member.name, [])
        except BaseException:
            await asyncio.gather(*(m.process.stop(self.spec.stop_grace) for m in group))
            raise
        finally:
            self._transient = [m for m in self._transient if m not in group]
        self.engines += group
        self._write_backends_file()
        self._write_fleet_file()
        return group

    async def retire_group(self, name: str) -> dict[str, int | None]:
        """Take a serving group out of the router's list and stop its members (SIGTERM: a supervisor
        drains first, joining a drain already done), each bounded by the stop grace."""
        group = [m for m in self.engines if m.group == name]
        if not group:
            raise KeyError(name)
        self.engines = [m for m in self.engines if m.group != name]
        self._transient += group
        self._write_backends_file()
        self._write_fleet_file()
        try:
            codes = await asyncio.gather(*(m.process.stop(self.spec.stop_grace) for m in group))
        finally:
            self._transient = [m for m in self._transient if m not in group]
        return {m.name: code for m, code in zip(group, codes, strict=True)}

    async def _wait_healthy(
        self, session: aiohttp.ClientSession, member: Member, path: str, within: float | None = None
    ) -> None:
        within = within or self.spec.startup_timeout
        deadline = time.monotonic() + within
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if not member.process.running:
                tail = "\n".join(list(member.process.last_lines)[-15:])
                raise FleetStartError(
                    f"{member.name} exited with code {member.process.returncode} while starting "
                    f"(log: {member.log_path}):\n{tail}"
                )
            try:
                async with session.get(member.url + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
                    last_error = f"{path} answered {r.status}"
                    body = await r.json(content_type=None) if r.status == 503 else None
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                last_error, body = type(exc).__name__, None
            if isinstance(body, dict) and body.get("state") == "FAILED":
                tail = "\n".join(list(member.process.last_lines)[-15:])
                raise FleetStartError(
                    f"{member.name} failed: {body.get('reason')} (log: {member.log_path}):\n{tail}"
                )
            if isinstance(body, dict) and body.get("reason"):
                last_error += f", {body.get('state')}: {body.get('reason')}"
            await asyncio.sleep(0.1)
        raise FleetStartError(
            f"{member.name} at {member.url} did not answer {path} with 200 within "
            f"{within:g}s (last: {last_error}; log: {member.log_path}); "
            "raise the startup timeout if the engine needs longer"
        )

    def exited(self) -> list[Member]:
        """Members whose process has ended on its own."""
        return [m for m in self.members if m.process.returncode is not None]

    async def stop(self) -> dict[str, int | None]:
        """Router first (traffic stops at the front), then every supervisor, which drains and stops
        its engine; each bounded by the grace, after which its whole process group is killed."""
        codes: dict[str, int | None] = {}
        if self.router is not None:
            codes[self.router.name] = await self.router.process.stop(self.spec.stop_grace)
        engines = [*self.engines, *self._transient]
        results = await asyncio.gather(*(m.process.stop(self.spec.stop_grace) for m in engines))
        for member, code in zip(engines, results, strict=True):
            codes[member.name] = code
        if self._sockets is not None:  # every daemon has stopped with its supervisor
            shutil.rmtree(self._sockets, ignore_errors=True)
        return codes
