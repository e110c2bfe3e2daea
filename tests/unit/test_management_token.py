"""The one reader of a supervisor's management token that every CLI uses: --token-file, else
$CORRAL_TOKEN."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.supervisor_tokens import TokenFileError, read_management_token


def test_the_file_wins_over_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  from-file\n")
    assert read_management_token(token_file, {"CORRAL_TOKEN": "from-env"}) == "from-file"


def test_without_a_file_the_environment_and_an_empty_variable_is_none() -> None:
    assert read_management_token(None, {"CORRAL_TOKEN": "from-env"}) == "from-env"
    assert read_management_token(None, {"CORRAL_TOKEN": ""}) is None
    assert read_management_token(None, {}) is None


@pytest.mark.parametrize("why", ["empty", "unreadable"])
def test_an_unusable_file_is_an_error_naming_it_never_the_environment(tmp_path: Path, why: str) -> None:
    path = tmp_path / "token"
    if why == "empty":
        path.write_text("\n")
    else:
        path.mkdir()
    with pytest.raises(TokenFileError) as caught:
        read_management_token(path, {"CORRAL_TOKEN": "from-env"})
    assert why in str(caught.value) and str(path) in str(caught.value)
    assert caught.value.naming("--token-file").startswith(f"--token-file {str(path)!r} is {why}")
