"""LoRA adapters of one engine: the desired set (`--lora NAME=PATH`, plus what `/v1/lora/load` added),
reconciled against what the engine serves after every (re)start, before the engine is READY; and the
engine calls for it (`/v1/models`, `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, the adapters
in flight from `vllm:lora_requests_info`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from corral.engine.metric_names import LORA_INFO, LORA_RUNNING_LABEL, LORA_WAITING_LABEL
from corral.engine.metrics_text import samples
from corral.supervisor.state.runtime_adapters import RuntimeAdapterFile


class AdapterSpecError(ValueError):
    """A `--lora` value that is not NAME=PATH."""


def parse_lora(spec: str) -> tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise AdapterSpecError(f"--lora {spec!r}: expected NAME=PATH, e.g. --lora sql=/adapters/sql")
    return name.strip(), path.strip()


class AdapterCallFailed(Exception):
    def __init__(self, call: str, status: int | None, message: str) -> None:
        super().__init__(
            f"{call}: {'HTTP ' + str(status) if status is not None else 'no answer'}: {message[:300]}"
        )
        self.status = status


@dataclass
class AdapterSet:
    """What should be loaded (name → path) and what the engine was last seen serving. `runtime` is
    the part of `desired` that `/v1/lora/load` added; with a `store` it outlives the supervisor."""

    desired: dict[str, str] = field(default_factory=dict)
    served: list[str] = field(default_factory=list)
    last_reconcile: dict[str, Any] | None = None
    runtime: dict[str, str] = field(default_factory=dict)
    store: RuntimeAdapterFile | None = None
    # GPU bytes each runtime load was seen to take (lora_memory.py): what its unload must free
    load_growth: dict[str, int] = field(default_factory=dict)

    def restore(self, runtime: dict[str, str], store: RuntimeAdapterFile) -> None:
        self.store = store
        self.runtime = dict(runtime)
        self.desired.update(runtime)

    def add_runtime(self, name: str, path: str) -> None:
        """Desired from now on, also after a restart; raises OSError when it could not be persisted
        (and then changes nothing)."""
        self._persist({**self.runtime, name: path})
        self.runtime[name] = path
        self.desired[name] = path

    def note_served(self, served: list[str]) -> None:
        """What the engine was just seen serving (a LoRA operation's own check)."""
        self.served = served

    def remove(self, name: str) -> None:
        """No longer desired; raises OSError when a runtime adapter's removal could not be persisted
        (it is then out of this life's desired set, but a restart would load it again)."""
        self.desired.pop(name, None)
        if name in self.runtime:
            del self.runtime[name]
            self._persist(self.runtime)

    def _persist(self, runtime: dict[str, str]) -> None:
        if self.store is not None:
            self.store.write(runtime)

    def to_json(self) -> dict[str, Any]:
        return {
            "desired": dict(self.desired),
            "served": list(self.served),
            "last_reconcile": self.last_reconcile,
            "runtime": sorted(self.runtime),
        }


class EngineAdapters:
    def __init__(self, session: aiohttp.ClientSession, engine_url: str) -> None:
        self._session = session
        self.engine_url = engine_url.rstrip("/")

    async def served(self) -> list[str]:
        """Adapter names the engine lists in /v1/models (entries with a `parent`)."""
        try:
            async with self._session.get(
                self.engine_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise AdapterCallFailed("GET /v1/models", resp.status, raw.decode(errors="replace"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AdapterCallFailed("GET /v1/models", None, str(exc)) from exc
        body = orjson.loads(raw)
        return sorted(str(m["id"]) for m in body.get("data", []) if m.get("parent"))

    async def _post(self, path: str, body: dict[str, Any]) -> str:
        try:
            async with self._session.post(
                self.engine_url + path,
                data=orjson.dumps(body),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=120),
            ) as resp:
                text = (await resp.read()).decode(errors="replace")
                if resp.status != 200:
                    raise AdapterCallFailed(f"POST {path}", resp.status, text)
                return text
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AdapterCallFailed(f"POST {path}", None, str(exc)) from exc

    async def load(self, name: str, path: str) -> str:
        return await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    async def unload(self, name: str) -> str:
        return await self._post("/v1/unload_lora_adapter", {"lora_name": name})

    async def in_flight(self) -> set[str] | None:
        """Adapters with running or waiting requests now (None: the engine does not report them)."""
        try:
            async with self._session.get(
                self.engine_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        return lora_in_flight(text)


def lora_in_flight(text: str) -> set[str] | None:
    """From `vllm:lora_requests_info`, whose current series is the one with the latest timestamp value."""
    latest: tuple[float, dict[str, str]] | None = None
    for sample in samples(text, (LORA_INFO,), strict=True):
        if latest is None or sample.value >= latest[0]:
            latest = (sample.value, sample.labels)
    if latest is None:
        return None
    names: set[str] = set()
    for key in (LORA_RUNNING_LABEL, LORA_WAITING_LABEL):
        names |= {n for n in latest[1].get(key, "").split(",") if n}
    return names


async def reconcile(adapters: EngineAdapters, wanted: AdapterSet) -> dict[str, Any]:
    """Load every desired adapter the engine does not serve; returns what was done (for the oplog).
    Raises `AdapterCallFailed` naming the adapter that could not be loaded."""
    wanted.load_growth.clear()  # what a load took belongs to that engine's life, not this one's
    served = await adapters.served()
    loaded: list[str] = []
    for name, path in sorted(wanted.desired.items()):
        if name in served:
            continue
        try:
            await adapters.load(name, path)
        except AdapterCallFailed as exc:
            raise AdapterCallFailed(
                f"loading desired adapter {name!r} from {path!r}", exc.status, str(exc)
            ) from exc
        loaded.append(name)
    wanted.served = await adapters.served()
    missing = sorted(set(wanted.desired) - set(wanted.served))
    if missing:
        raise AdapterCallFailed("reconcile", None, f"adapters {missing} not listed after loading")
    result = {
        "loaded": loaded,
        "already_served": sorted(set(served) & set(wanted.desired)),
        "served": wanted.served,
    }
    wanted.last_reconcile = result
    return result
