"""Per-pod supervisor tokens: a pod's management token is HMAC-SHA256(fleet key,
"corral-supervisor:NAMESPACE/POD") in hex, so a token read out of one pod opens that pod's supervisor
and no other, while whoever holds the fleet key (the router, an operator) derives any pod's token from
the pod's name. The key itself stays in one Secret, mounted only where tokens are derived. Every CLI
reads a supervisor's management token here: from its token file, else from $CORRAL_TOKEN.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

CONTEXT = b"corral-supervisor:"
MIN_KEY_BYTES = 32
MAKE_ONE = "make one with `openssl rand -hex 32`"
TOKEN_ENV = "CORRAL_TOKEN"


class TokenFileError(ValueError):
    """A management token file is unreadable or empty; `why` finishes "<flag> 'path' ..." and never
    holds the token."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"token file {str(path)!r} {why}")
        self.path = path
        self.why = why

    def naming(self, flag: str) -> str:
        """The message with the file named by the flag that gave it."""
        return f"{flag} {str(self.path)!r} {self.why}"


def read_management_token(token_file: Path | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """A supervisor's management token: the file's content without surrounding whitespace, else
    $CORRAL_TOKEN, else None (an empty variable counts as unset)."""
    if token_file is None:
        return environ.get(TOKEN_ENV) or None
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(token_file, f"is unreadable: {getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise TokenFileError(token_file, "is empty")
    return token


class FleetKeyError(ValueError):
    """The fleet key file is missing, unreadable or too short; the message never holds the key."""


def read_fleet_key(path: Path) -> bytes:
    """The fleet key: the file's content without surrounding whitespace, at least 32 bytes."""
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise FleetKeyError(
            f"fleet key file {str(path)!r} is unreadable: {exc.strerror or exc}; {MAKE_ONE}"
        ) from None
    if len(key) < MIN_KEY_BYTES:
        raise FleetKeyError(
            f"fleet key in {str(path)!r} is {len(key)} bytes, fewer than {MIN_KEY_BYTES}; {MAKE_ONE}"
        )
    return key


def pod_token(key: bytes, namespace: str, name: str) -> str:
    """The token of the supervisor in pod `namespace`/`name`."""
    for what, value in (("namespace", namespace), ("pod name", name)):
        if not value or "/" in value:
            raise ValueError(
                f"{what} {value!r}: a pod is named by a namespace and a name, neither empty nor with '/'"
            )
    return hmac.new(key, CONTEXT + f"{namespace}/{name}".encode(), hashlib.sha256).hexdigest()


def endpoint_pod_token(key: bytes, pod: str | None) -> str | None:
    """The token for a pod known as "NAMESPACE/NAME" (how Kubernetes discovery names endpoints);
    None for anything else, which then gets no token (and its supervisor refuses the call)."""
    if pod is None or pod.count("/") != 1:
        return None
    namespace, name = pod.split("/")
    if not namespace or not name:
        return None
    return pod_token(key, namespace, name)
