"""The local fleet behind `corral up`: N simulated engines and one router, as child processes on loopback.

It owns start order (engines, then the router once every engine answers), readiness waits with
deadlines, and a stop that leaves no process behind whatever a child does.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

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
    stop_grace: float = 10.0
    sim_args: tuple[str, ...] = ()


@dataclass
class Member:
    name: str
    url: str
    process: ChildProcess
    log_path: Path
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

    def __init__(self, spec: FleetSpec, log_dir: Path, echo: LineSink | None = None) -> None:
        self.spec = spec
        self.log_dir = log_dir
        self._echo = echo
        self.engines: list[Member] = []
        self.router: Member | None = None

    @property
    def router_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.router_port}"

    @property
    def members(self) -> list[Member]:
        return [*self.engines, *([self.router] if self.router else [])]

    def _spawn(self, name: str, url: str, args: list[str]) -> Member:
        log_path = self.log_dir / f"{name}.log"
        argv = [sys.executable, "-m", "corral", *args]
        sink = _file_sink(log_path, self._echo_for(name))
        return Member(name, url, ChildProcess(name, argv, sink=sink), log_path)

    def _echo_for(self, name: str) -> LineSink | None:
        echo = self._echo
        if echo is None:
            return None
        return lambda line: echo(f"[{name}] {line}")

    async def start(self) -> None:
        """Start every engine, wait for each to answer, then start the router and wait for it."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        for i in range(spec.engines):
            port = free_port(spec.host)
            args = ["sim", "--host", spec.host, "--port", str(port), "--model", spec.model]
            args += ["--seed", str(i), *spec.sim_args]
            member = self._spawn(f"engine-{i}", f"http://{spec.host}:{port}", args)
            await member.process.start()
            self.engines.append(member)
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._wait_healthy(session, m, "/health") for m in self.engines))
            router_args = ["router", "--host", spec.host, "--port", str(spec.router_port)]
            router_args += ["--policy", spec.policy]
            for engine in self.engines:
                router_args += ["--backend", engine.url]
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
            except (aiohttp.ClientError, TimeoutError) as exc:
                last_error = type(exc).__name__
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
        """Router first (traffic stops at the front), then every engine; each bounded by the grace."""
        codes: dict[str, int | None] = {}
        if self.router is not None:
            codes[self.router.name] = await self.router.process.stop(self.spec.stop_grace)
        results = await asyncio.gather(*(m.process.stop(self.spec.stop_grace) for m in self.engines))
        for member, code in zip(self.engines, results, strict=True):
            codes[member.name] = code
        return codes
