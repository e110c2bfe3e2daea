"""A key a person put in a file named on the command line (an admin key, a tenant key, an engine's API
key, a peer token): read as one word, with errors that name the flag and the file, never the content.
The router's listeners and the CLIs that call a locked-down fleet share it."""

from __future__ import annotations

from pathlib import Path


class SecretFileError(Exception):
    """A key file given on the command line cannot be read or is empty."""


def read_secret_file(path: Path, flag: str) -> str:
    """The one secret in `path` (surrounding whitespace dropped); errors name the flag and the file,
    never the content."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise SecretFileError(f"{flag} {str(path)!r} is unreadable: {why}") from None
    if not secret:
        raise SecretFileError(f"{flag} {str(path)!r} is empty; put the key in it")
    if any(c.isspace() for c in secret):
        raise SecretFileError(f"{flag} {str(path)!r} holds more than one word; put only the key in it")
    return secret
