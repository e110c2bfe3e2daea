"""Who may read this router's picks (`GET /internal/peer-picks`, corral.router.routing.pick_log): its
peer replicas, and only with the shared secret (`--peer-token-file`) as `Authorization: Bearer`. The
route exists only on a router started with `--peer` (404 elsewhere), is served on the main port only
(the URL the peers are given), never on `--admin-port`, and is refused to a browser's request (any
`Origin`). No loopback exception: the token is asked of every caller. A missing token is answered 401,
a wrong one 403, both in OpenAI's error shape and neither saying anything of the picks; the token is
compared by its SHA-256 digest in constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

import click
from aiohttp import web

from corral.openai_errors import error_response
from corral.router.edge.admin_access import AdminAccess
from corral.router.routing.peer_wire import PEER_PICKS_PATH
from corral.secret_file import SecretFileError, read_secret_file

_PEER_URL = re.compile(r"^https?://[^/\s?#=]+/?$")


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """`--peer` and `--peer-token-file`: the peer replicas' base URLs and the secret they share."""

    urls: tuple[str, ...]
    token: str = field(repr=False)
    incarnation: str  # this router's life (made once per `corral router`, shared by its workers)

    @property
    def token_sha256(self) -> bytes:
        return hashlib.sha256(self.token.encode("utf-8")).digest()


def peer_settings(peers: tuple[str, ...], token_file: Path | None, incarnation: str) -> PeerSettings | None:
    """The flags, checked: a usage error says which value is wrong and what to do."""
    if not peers:
        if token_file is not None:
            raise click.UsageError("--peer-token-file is for --peer URL; name the peer routers, or drop it.")
        return None
    urls: list[str] = []
    for spec in peers:
        if not _PEER_URL.match(spec.strip()):
            raise click.UsageError(
                f"--peer {spec!r}: give a peer router's base URL, scheme, host and port, e.g. "
                "http://10.0.0.2:8000"
            )
        url = spec.strip().rstrip("/")
        if url not in urls:
            urls.append(url)
    if token_file is None:
        raise click.UsageError(
            "--peer needs --peer-token-file PATH: a file with one secret, the same on every peer router "
            "(e.g. `openssl rand -hex 32 > peer.token`)"
        )
    try:
        token = read_secret_file(token_file, "--peer-token-file")
    except SecretFileError as exc:
        raise click.UsageError(str(exc)) from None
    return PeerSettings(tuple(urls), token, incarnation)


class PeerAccess:
    """Answers whether one request may read the peer route, and refuses it otherwise."""

    def __init__(self, settings: PeerSettings, admin: AdminAccess) -> None:
        self._digest = settings.token_sha256
        self._admin = admin
        self.denied = 0

    def refuse(self, request: web.Request) -> web.Response | None:
        """None when `request` may read the picks; else the answer that ends it here."""
        if self._admin.on_admin_port(request):
            return error_response(
                404, f"{PEER_PICKS_PATH} is served on the router's main port, not here.", "NotFoundError"
            )
        if request.headers.get("Origin") is not None:
            self.denied += 1
            return error_response(
                403, f"{PEER_PICKS_PATH} is for peer routers, not for pages in a browser.", "permission_error"
            )
        header = request.headers.get("Authorization")
        if not header or header[:7].lower() != "bearer ":
            self.denied += 1
            return error_response(
                401,
                f"{PEER_PICKS_PATH} is for this router's peers: send `Authorization: Bearer <peer token>` "
                "(the secret in its --peer-token-file).",
                "authentication_error",
                headers={"WWW-Authenticate": 'Bearer realm="corral-router-peers"'},
            )
        digest = hashlib.sha256(header[7:].strip().encode("utf-8", "surrogatepass")).digest()
        if not hmac.compare_digest(digest, self._digest):
            self.denied += 1
            return error_response(
                403,
                f"{PEER_PICKS_PATH}: the peer token is not this router's; give every peer router the "
                "same --peer-token-file.",
                "permission_error",
            )
        return None
