"""The local fleet behind `corral up`: N simulated engines, each under its own `corral supervise`, and
one router, as child processes on loopback.

The router follows every supervisor's state stream (`--supervised ENGINE=SUPERVISOR`), so a drain
of one engine is acknowledged by the router before the engine's in-flight work is touched.

It owns start order (supervised engines, then the router once every supervisor reports READY),
readiness waits with deadlines, the fleet file `corral status` reads, and a stop that leaves no
process behind whatever a child does.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from corral.child_process import ChildProcess, LineSink


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    # the supervisor's drain on stop: short, because a local fleet's router stops first
    propagation_timeout: float = 2.0
    quiet_period: float = 0.5
    drain_timeout: float = 10.0
    engine_shutdown_timeout: float = 5.0


@dataclass
class Member:
    """One process of the fleet: `url` is what the rest of the fleet talks to (for an engine, the
    supervisor's probes and management API; the engine itself answers at `engine_url`)."""

    name: str
    url: str
    process: ChildProcess
    log_path: Path
    engine_url: str = ""
    started_at: float = field(default_factory=time.monotonic)


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
        self, spec: FleetSpec, log_dir: Path, fleet_file: Path, echo: LineSink | None = None
    ) -> None:
        self.spec = spec
        self.log_dir = log_dir
        self.fleet_file = fleet_file
        self._echo = echo
        self.engines: list[Member] = []
        self.router: Member | None = None

    @property
    def router_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.router_port}"

    @property
    def members(self) -> list[Member]:
        return [*self.engines, *([self.router] if self.router else [])]

    def _spawn(self, name: str, url: str, args: list[str], engine_url: str = "") -> Member:
        log_path = self.log_dir / f"{name}.log"
        argv = [sys.executable, "-m", "corral", *args]
        sink = _file_sink(log_path, self._echo_for(name))
        return Member(name, url, ChildProcess(name, argv, sink=sink), log_path, engine_url)

    def _supervised_engine(self, i: int) -> Member:
        spec, host = self.spec, self.spec.host
        engine_port, supervisor_port = free_port(host), free_port(host)
        engine_url = f"http://{host}:{engine_port}"
        sim = [sys.executable, "-m", "corral", "sim", "--host", host, "--port", str(engine_port)]
        sim += ["--model", spec.model, "--seed", str(i), *spec.sim_args]
        args = ["supervise", "--host", host, "--port", str(supervisor_port), "--engine-url", engine_url]
        args += ["--model", spec.model, "--state-dir", str(self.log_dir / f"engine-{i}.state")]
        args += ["--propagation-timeout", str(spec.propagation_timeout)]
        args += ["--quiet-period", str(spec.quiet_period), "--drain-timeout", str(spec.drain_timeout)]
        args += ["--shutdown-timeout", str(spec.engine_shutdown_timeout), "--", *sim]
        return self._spawn(f"engine-{i}", f"http://{host}:{supervisor_port}", args, engine_url)

    def _write_fleet_file(self) -> None:
        """Where `corral status` finds this fleet; written atomically (temp file, then rename)."""
        body = {
            "router": self.router_url,
            "pid": os.getpid(),
            "logs": str(self.log_dir),
            "engines": [{"name": m.name, "supervisor": m.url, "engine": m.engine_url} for m in self.engines],
        }
        self.fleet_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.fleet_file.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        tmp.replace(self.fleet_file)

    def _echo_for(self, name: str) -> LineSink | None:
        echo = self._echo
        if echo is None:
            return None
        return lambda line: echo(f"[{name}] {line}")

    async def start(self) -> None:
        """Start every supervised engine, wait until each supervisor reports READY (the engine
        answered and passed its smoke request), then start the router and wait for it."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        for i in range(spec.engines):
            member = self._supervised_engine(i)
            await member.process.start()
            self.engines.append(member)
        self._write_fleet_file()
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._wait_healthy(session, m, "/readyz") for m in self.engines))
            router_args = ["router", "--host", spec.host, "--port", str(spec.router_port)]
            router_args += ["--policy", spec.policy, "--router-id", "local-router"]
            for engine in self.engines:
                # with its supervisor: routed only while it says READY, and each drain confirmed
                router_args += ["--supervised", f"{engine.engine_url}={engine.url}"]
            self.router = self._spawn("router", self.router_url, router_args)
            await self.router.process.start()
            await self._wait_healthy(session, self.router, "/health")

    async def _wait_healthy(self, session: aiohttp.ClientSession, member: Member, path: str) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout
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
            await asyncio.sleep(0.1)
        raise FleetStartError(
            f"{member.name} at {member.url} did not answer {path} with 200 within "
            f"{self.spec.startup_timeout:.0f}s (last: {last_error}; log: {member.log_path}); "
            "raise --startup-timeout if the engine needs longer"
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
        results = await asyncio.gather(*(m.process.stop(self.spec.stop_grace) for m in self.engines))
        for member, code in zip(self.engines, results, strict=True):
            codes[member.name] = code
        self.fleet_file.unlink(missing_ok=True)
        return codes
