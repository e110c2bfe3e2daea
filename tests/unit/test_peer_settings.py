"""`--peer` and `--peer-token-file` are checked as the router starts (`edge.peer_access.peer_settings`):
each refusal names the flag, the value at fault and what to do, never the secret."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from corral.router.edge.peer_access import peer_settings


def test_no_peer_is_no_change() -> None:
    assert peer_settings((), None, "i") is None


def test_peers_are_read_with_the_shared_secret(tmp_path: Path) -> None:
    token = tmp_path / "peer.token"
    token.write_text("  s3cret-value\n")
    settings = peer_settings(("http://10.0.0.2:8000/", "http://10.0.0.2:8000", "https://r3:443"), token, "i")
    assert settings is not None
    assert settings.urls == ("http://10.0.0.2:8000", "https://r3:443") and settings.token == "s3cret-value"
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("peers", "content", "says"),
    [
        (("http://10.0.0.2:8000",), None, "--peer needs --peer-token-file"),
        (("http://10.0.0.2:8000",), "", "is empty"),
        (("http://10.0.0.2:8000",), "two words", "more than one word"),
        (("http://10.0.0.2:8000",), "missing", "is unreadable"),
        (("10.0.0.2:8000",), "k", "--peer '10.0.0.2:8000': give a peer router's base URL"),
        (("http://10.0.0.2:8000/internal",), "k", "base URL"),
        ((), "k", "--peer-token-file is for --peer"),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_it(
    tmp_path: Path, peers: tuple[str, ...], content: str | None, says: str
) -> None:
    token: Path | None = None
    if content is not None:
        token = tmp_path / "peer.token"
        if content != "missing":
            token.write_text(content)
    with pytest.raises(click.UsageError, match=says.replace("(", r"\(")) as refused:
        peer_settings(peers, token, "i")
    assert "two words" not in str(refused.value)
