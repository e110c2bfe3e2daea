"""Dependencies the engine needs at init (`--requires`): a Unix socket, a TCP endpoint or a file.

It reproduces an engine whose KV-cache connector (vineyard, LMCache server, ...) is not up yet: the
engine core checks once during init and fails the whole start if the dependency is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Requirement:
    """`unix:/path`, `tcp:host:port`, `file:/path` or a bare path."""

    kind: str
    target: str
    spec: str

    @classmethod
    def parse(cls, spec: str) -> Requirement:
        kind, sep, rest = spec.partition(":")
        if sep and kind in ("unix", "tcp", "file"):
            if kind == "tcp":
                host, colon, port = rest.rpartition(":")
                if not colon or not port.isdigit() or not host:
                    raise ValueError(f"--requires {spec!r}: expected tcp:HOST:PORT")
            if not rest:
                raise ValueError(f"--requires {spec!r}: empty target")
            return cls(kind, rest, spec)
        return cls("file", spec, spec)

    async def check(self, connect_timeout: float = 2.0) -> str | None:
        """None when the dependency is there, otherwise why not."""
        if self.kind == "file":
            exists = await asyncio.to_thread(Path(self.target).exists)
            return None if exists else f"{self.target}: no such file or directory"
        try:
            if self.kind == "unix":
                conn = asyncio.open_unix_connection(self.target)
            else:
                host, _, port = self.target.rpartition(":")
                conn = asyncio.open_connection(host.strip("[]"), int(port))
            _, writer = await asyncio.wait_for(conn, connect_timeout)
        except TimeoutError:
            return f"{self.target}: no answer within {connect_timeout}s"
        except OSError as exc:
            return f"{self.target}: {exc.strerror or exc!r}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None
