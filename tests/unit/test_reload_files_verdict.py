"""What a weight reload did to the model files (`runbook/reload_checks.files_verdict`), from their
digests as last loaded, just before `reload_weights`, and after it: changed, unchanged (a reload of the
same weights, not an error), not measured (no local directory), or changed during the reload (an error:
which weights the engine holds is not known)."""

from __future__ import annotations

import pytest

from corral.supervisor.runbook.reload_checks import files_verdict


def test_new_files_are_changed() -> None:
    assert files_verdict("old", "new", "new") == "changed"


def test_the_same_files_are_a_reload_of_the_same_weights() -> None:
    assert files_verdict("same", "same", "same").startswith("unchanged")


def test_a_model_that_is_no_directory_is_not_measured() -> None:
    assert files_verdict(None, None, None).startswith("not_measured")


@pytest.mark.parametrize(("at_call", "now"), [("a", "b"), ("a", None), (None, "b")])
def test_files_that_changed_during_the_reload_are_an_error(at_call: str | None, now: str | None) -> None:
    with pytest.raises(ValueError, match="changed during the reload"):
        files_verdict("a", at_call, now)
