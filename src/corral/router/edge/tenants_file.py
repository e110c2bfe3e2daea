"""The API keys file (`--api-keys-file`): a YAML list of `{name, key | key_sha256, max_in_flight?,
requests_per_minute?, models?, priority?, max_priority?, weight?, deadline_ms?}`, read into `TenantSpec`s
(the last four are flow control's: corral.router.flow). A plaintext `key` is hashed as it is read,
so only SHA-256 digests are held; every problem names the entry and the field, never the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from corral.router.flow.config import MAX_DEADLINE_MS, MAX_PRIORITY, MAX_WEIGHT, MIN_PRIORITY

log = logging.getLogger("corral.router.tenants")


FIELDS = frozenset(
    {
        "name",
        "key",
        "key_sha256",
        "max_in_flight",
        "requests_per_minute",
        "models",
        "priority",
        "max_priority",
        "weight",
        "deadline_ms",
    }
)


_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class TenantsFileError(Exception):
    """The API keys file cannot be read, or one of its entries is not a tenant."""


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """One entry of the file, as validated: the key only as its SHA-256 digest."""

    name: str
    key_sha256: bytes = b""
    max_in_flight: int | None = None
    requests_per_minute: int | None = None
    models: frozenset[str] | None = None  # None: every model
    priority: int = 0  # its requests' band in the flow queue; negative: sheddable
    max_priority: int | None = None  # the highest x-corral-priority it may send; None: it may not
    weight: int = 1  # its share of its band against the other tenants waiting there
    deadline_ms: int | None = None  # its requests' deadline when they send none (order `edf`)

    def __repr__(self) -> str:  # the digest is not the key, but it has no business in logs either
        return f"TenantSpec(name={self.name!r})"


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def parse_tenants(text: str, path: Path | str) -> list[TenantSpec]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise TenantsFileError(f"{path}: not valid YAML{where}; write a list of tenants") from None
    except ValueError:  # YAML reads a number with int(): past 4,300 digits Python refuses it
        raise TenantsFileError(
            f"{path}: a number in the file has thousands of digits; every field's bound is far below that"
        ) from None
    if document is None:
        document = []
    if not isinstance(document, list):
        raise TenantsFileError(
            f"{path}: the file must be a YAML list of tenants "
            "(- name: team-a\\n  key_sha256: <64 hex digits>), not a {type(document).__name__}"
        )
    specs: list[TenantSpec] = []
    names: set[str] = set()
    digests: dict[bytes, str] = {}
    for number, entry in enumerate(document, start=1):
        spec = _parse_entry(entry, number, path)
        where = f"{path}: entry {number} (name {spec.name!r})"
        if spec.name in names:
            raise TenantsFileError(
                f"{where}: field `name`: another entry has this name; names must be unique"
            )
        other = digests.get(spec.key_sha256)
        if other is not None:
            raise TenantsFileError(
                f"{where}: its key is also tenant {other!r}'s; give each tenant its own key"
            )
        names.add(spec.name)
        digests[spec.key_sha256] = spec.name
        specs.append(spec)
    return specs


def _parse_entry(entry: object, number: int, path: Path | str) -> TenantSpec:
    where = f"{path}: entry {number}"
    if not isinstance(entry, dict):
        raise TenantsFileError(f"{where}: must be a mapping with `name` and `key` or `key_sha256`")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise TenantsFileError(
            f"{where}: field `name` must be 1-63 letters, digits, '.', '_' or '-' "
            f"(it labels metrics), got {name!r}"
        )
    where = f"{where} (name {name!r})"
    unknown = sorted(str(k) for k in entry if k not in FIELDS)
    if unknown:
        raise TenantsFileError(
            f"{where}: unknown field `{unknown[0]}`; the fields are {', '.join(sorted(FIELDS))}"
        )
    key, hashed = entry.get("key"), entry.get("key_sha256")
    if (key is None) == (hashed is None):
        raise TenantsFileError(f"{where}: give exactly one of the fields `key` and `key_sha256`")
    if key is not None:
        # never echo the value: it may be a real key with one character wrong
        if not isinstance(key, str) or len(key) < 16:
            raise TenantsFileError(f"{where}: field `key` must be a string of at least 16 characters")
        digest = key_digest(key)
    else:
        if not isinstance(hashed, str) or not _HEX64.match(hashed):
            raise TenantsFileError(
                f"{where}: field `key_sha256` must be 64 hex digits, quoted (printf %s KEY | sha256sum)"
            )
        digest = bytes.fromhex(hashed)
    return TenantSpec(
        name=name,
        key_sha256=digest,
        max_in_flight=_positive(entry, "max_in_flight", where),
        requests_per_minute=_positive(entry, "requests_per_minute", where),
        models=_models(entry.get("models"), where),
        priority=_bounded(entry, "priority", where, MIN_PRIORITY, MAX_PRIORITY) or 0,
        max_priority=_bounded(entry, "max_priority", where, MIN_PRIORITY, MAX_PRIORITY),
        weight=_bounded(entry, "weight", where, 1, MAX_WEIGHT) or 1,
        deadline_ms=_bounded(entry, "deadline_ms", where, 1, MAX_DEADLINE_MS),
    )


def _bounded(entry: dict[Any, Any], field: str, where: str, low: int, high: int) -> int | None:
    value = entry.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise TenantsFileError(
            f"{where}: field `{field}` must be a whole number from {low} to {high}, got {shown}"
        )
    return value


def _positive(entry: dict[Any, Any], field: str, where: str) -> int | None:
    value = entry.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TenantsFileError(f"{where}: field `{field}` must be a positive integer, got {value!r}")
    return value


def _models(value: object, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
        raise TenantsFileError(f"{where}: field `models` must be a list of model names, got {value!r}")
    return frozenset(value)


def read_tenants(path: Path) -> list[TenantSpec]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise TenantsFileError(f"cannot read the API keys file {path}: {why}") from None
    return parse_tenants(text, path)


def warn_if_readable(path: Path) -> None:
    with contextlib.suppress(OSError):
        if os.stat(path).st_mode & 0o077:
            log.warning(
                "the API keys file %s can be read by other users; chmod 600 it "
                "(or keep only key_sha256 entries in it)",
                path,
            )
