"""LoRA adapters the engine serves: loading and unloading by vLLM's rules, and who is using which.

vLLM's rules (`entrypoints/openai/models/serving.py`): both `lora_name` and `lora_path` non-empty, the name
must not be the base model's, an already loaded name is refused unless `load_inplace`; a path with no
adapter is a 404 `Loading lora X failed: No adapter found for <path>`. Unloading an unknown name is a 404;
it only forgets the name (in-flight requests for it go on). Here an adapter "exists" when `lora_path` is a
directory. Each adapter answers with its own deterministic text (its own generator seed).
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from corral.sim.core.generator import Generator
from corral.sim.core.lifecycle import worker_failure
from corral.sim.core.requests import RequestError

# vLLM strips file paths from error messages before answering (sanitize_message); so does the simulator.
_PATH_RE = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")


def sanitize(message: str) -> str:
    return _PATH_RE.sub("<path>", message).strip()


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    int_id: int
    base_model: str
    created: int
    generator: Generator = field(compare=False)


class LoraRegistry:
    """The loaded adapters (by name) and the running/waiting request counts per adapter."""

    def __init__(
        self, base_model: str, enabled: bool, max_loras: int, seed: int, default_max_tokens: int
    ) -> None:
        self.base_model = base_model
        self.enabled = enabled
        self.max_loras = max_loras
        self._seed = seed
        self._default_max_tokens = default_max_tokens
        self.adapters: dict[str, LoraAdapter] = {}
        self._next_id = 0
        self.running: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.version = 0  # bumped on every change, so /v1/models can cache its body

    def get(self, name: str) -> LoraAdapter | None:
        return self.adapters.get(name)

    def load(self, name: str, path: str, load_inplace: bool = False) -> str:
        """Load (or with `load_inplace` reload) an adapter; vLLM's success text, or a `RequestError`."""
        if not name or not path:
            raise RequestError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.base_model:
            raise RequestError(
                400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput"
            )
        if not load_inplace and name in self.adapters:
            raise RequestError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if not self.enabled:
            raise RequestError(
                500,
                worker_failure("add_lora", "LoRA is not enabled. Use --enable-lora to enable LoRA."),
                "InternalServerError",
            )
        if not Path(path).is_dir():
            raise RequestError(
                404, sanitize(f"Loading lora {name} failed: No adapter found for {path}"), "NotFoundError"
            )
        previous = self.adapters.get(name)
        if previous is not None:
            int_id = previous.int_id
        else:
            self._next_id += 1
            int_id = self._next_id
        seed = zlib.crc32(f"{self._seed}:{name}:{path}".encode())
        self.adapters[name] = LoraAdapter(
            name, path, int_id, self.base_model, int(time.time()), Generator(seed, self._default_max_tokens)
        )
        self.version += 1
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: str) -> str:
        if not name:
            raise RequestError(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
            )
        if name not in self.adapters:
            raise RequestError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.adapters[name]
        self.version += 1
        return f"Success: LoRA adapter '{name}' removed successfully."

    # -- usage (only requests for an adapter touch these) ------------------------------------------------

    def request_waiting(self, name: str) -> None:
        self.waiting[name] += 1

    def request_running(self, name: str) -> None:
        self.request_done(name, was_running=False)
        self.running[name] += 1

    def request_done(self, name: str, was_running: bool) -> None:
        counter = self.running if was_running else self.waiting
        counter[name] -= 1
        if counter[name] <= 0:
            del counter[name]

    def running_names(self) -> list[str]:
        return sorted(n for n, c in self.running.items() if c > 0)

    def waiting_names(self) -> list[str]:
        return sorted(n for n, c in self.waiting.items() if c > 0)


def parse_lora_module(spec: str) -> tuple[str, str]:
    """`name=path` (vLLM's old `--lora-modules` format) or `{"name": ..., "path": ...}`."""
    if "=" in spec and "," not in spec and not spec.lstrip().startswith("{"):
        name, _, path = spec.partition("=")
        return name, path
    try:
        obj = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Invalid JSON format for --lora-modules: {spec}") from exc
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("name"), str)
        or not isinstance(obj.get("path"), str)
    ):
        raise ValueError(f"Invalid fields for --lora-modules: {spec} - expected name and path")
    return obj["name"], obj["path"]
