"""A bundle file with a wrong type answers in plain words: what to write there and what it says now."""

from __future__ import annotations

import pytest

from corral.bundle_spec import BundleError, bundle_from_json


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"name": "v", "engine_args": "a string"},
            r"f.yaml: engine_args: write a list of strings, .*'a string'",
        ),
        ({"name": "v", "env": ["A=1"]}, r"env: write a mapping of names to strings.*\['A=1'\]"),
        ({"name": "v", "env": {"A": 1}}, r"env.A: write a string \(quote it.*it is 1$"),
        ({"name": "v", "engine_args": ["--x", 8192]}, r"engine_args.1: write a string .*it is 8192"),
    ],
)
def test_wrong_types_say_what_to_write(body: dict, message: str) -> None:
    with pytest.raises(BundleError, match=message) as caught:
        bundle_from_json(body, "f.yaml")
    assert "Input should be" not in str(caught.value)
