"""The bundle an engine serves, as one fingerprint: what its command line pins (model and revisions,
dtype, quantization, parallel layout, loader and connector config, chat template), what the engine
says it is (`/version`, the base models of `/v1/models`), the image, and the model files' digest when
the model is a local directory.

Cost of the file digest is capped: config, tokenizer and template files (anything up to 16 MiB) are
hashed whole; larger files (the weights) by name, size and a sampled SHA-256 of their first and last
MiB. A weight file rewritten in the middle at the same size is not seen; a new revision is.
Adapters are shown beside the bundle but are not part of it: they load and unload at run time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from corral.engine.flags import daemon_words, serving_settings
from corral.redaction import redact_json_text

WHOLE_FILE_LIMIT = 16 * 1024 * 1024
SAMPLE_BYTES = 1024 * 1024
FILE_DIGEST_METHOD = "files <=16MiB: sha256 of content; larger: name+size+sha256(first and last MiB)"


def command_parts(argv: Sequence[str]) -> dict[str, Any]:
    """The bundle-relevant settings of an engine command line (ports, hosts and seeds are not). A
    JSON-valued setting's secret keys (S3 keys in --model-loader-extra-config) are masked: the parts
    are shown in `/v1/state` and records, and a rotated credential is the same bundle. The weight
    cache's socket location is left out of the loader config: where a daemon listens is not what the
    engine serves."""
    parts: dict[str, Any] = {
        name: redact_json_text(value) if isinstance(value, str) else value
        for name, value in serving_settings(argv).items()
    }
    cache = parts.get("model_loader_extra_config")
    if isinstance(cache, str):  # where the weight cache's socket is: not what the engine serves
        parts["model_loader_extra_config"] = _without_socket(cache)
    template = parts.get("chat_template")
    if isinstance(template, str):
        path = Path(template)
        content = path.read_bytes() if path.is_file() else template.encode()
        parts["chat_template"] = "sha256:" + hashlib.sha256(content).hexdigest()[:16]
    return parts


_SOCKET_KEYS = ("socket_path", "socket_dir")


def _without_socket(text: str) -> str:
    """The loader config without its socket location: two engines of one bundle on one host load from
    two daemons, each on its own socket (`corral up --preload`), and serve the same thing."""
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if not isinstance(body, dict) or not any(k in body for k in _SOCKET_KEYS):
        return text
    kept = {k: v for k, v in body.items() if k not in _SOCKET_KEYS}
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS).decode()


def _file_digest(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    with path.open("rb") as fh:
        if size <= WHOLE_FILE_LIMIT:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
            return h.hexdigest()
        h.update(fh.read(SAMPLE_BYTES))
        fh.seek(size - SAMPLE_BYTES)
        h.update(fh.read(SAMPLE_BYTES))
    return f"sampled:{size}:{h.hexdigest()}"


def model_files_digest(model_dir: Path) -> dict[str, Any]:
    """One digest over every file of a local model directory (see the module docstring for cost)."""
    h = hashlib.sha256()
    count = 0
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        h.update(rel.encode() + b"\0" + _file_digest(path).encode() + b"\n")
        count += 1
    return {"digest": h.hexdigest()[:32], "files": count, "method": FILE_DIGEST_METHOD}


@dataclass(frozen=True)
class Bundle:
    """The fingerprint and the parts it was computed from; `adapters` are shown, not hashed."""

    fingerprint: str
    parts: dict[str, Any]
    adapters: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, **self.parts, "adapters": list(self.adapters)}


def fingerprint_of(parts: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def bundle_from(
    argv: Sequence[str],
    version: str | None,
    models: list[dict[str, Any]],
    image: str | None = None,
    hardware: dict[str, Any] | None = None,
    preload: Sequence[str] = (),
) -> Bundle:
    """`hardware` (GPU model and count, from PRECHECK's parallel identity) is a part only when known,
    so an engine whose GPUs nobody declared keeps the fingerprint it had; `preload` (the bundle-relevant
    settings of the weight-cache daemon's command, `sh -c` read through) likewise only when a daemon
    runs: a bundle is its engine and its daemon."""
    command = command_parts(argv)
    base = sorted(str(m.get("id")) for m in models if not m.get("parent"))
    adapters = sorted(str(m.get("id")) for m in models if m.get("parent"))
    parts: dict[str, Any] = {
        "image": image,
        "engine_version": version,
        "served_models": base,
        "command": command,
        "model_files": None,
    }
    if hardware is not None:
        parts["hardware"] = hardware
    if preload:  # what the daemon serves, as for the engine: not its health port nor its socket
        parts["preload"] = command_parts(daemon_words(preload))
    model = command.get("model")
    if isinstance(model, str) and Path(model).is_dir():
        parts["model_files"] = model_files_digest(Path(model))
    return Bundle(fingerprint_of(parts), parts, adapters)


async def read_bundle(
    session: aiohttp.ClientSession,
    engine_url: str,
    argv: Sequence[str],
    request_seconds: float = 5.0,
    image: str | None = None,
    hardware: dict[str, Any] | None = None,
    preload: Sequence[str] = (),
) -> Bundle:
    """Ask the engine for its version and models, then fingerprint; the image is `image` (the engine
    environment's $CORRAL_IMAGE) else our $CORRAL_IMAGE (set it in the pod spec to the image reference)."""
    limit = aiohttp.ClientTimeout(total=request_seconds)
    version: str | None = None
    models: list[dict[str, Any]] = []
    try:
        async with session.get(engine_url + "/version", timeout=limit) as resp:
            if resp.status == 200:
                body = await resp.json(content_type=None)
                version = str(body.get("version")) if isinstance(body, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        version = None
    try:
        async with session.get(engine_url + "/v1/models", timeout=limit) as resp:
            if resp.status == 200:
                body = await resp.json(content_type=None)
                data = body.get("data") if isinstance(body, dict) else None
                models = [m for m in data or [] if isinstance(m, dict)]
    except (aiohttp.ClientError, TimeoutError, ValueError):
        models = []
    # hashing model files reads the disk: off the event loop, which keeps serving probes meanwhile
    image = image if image is not None else os.environ.get("CORRAL_IMAGE")
    return await asyncio.to_thread(bundle_from, argv, version, models, image, hardware, preload)
