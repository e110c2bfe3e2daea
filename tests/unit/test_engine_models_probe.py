from pathlib import Path

import pytest

from corral.engine.models_probe import ModelsProbeError, describe, parse_model_cards
from corral.engine.page_get import PageError

REAL = (Path(__file__).parents[1] / "data" / "vllm-samples" / "models.body").read_bytes()


def test_real_models_answer_gives_its_cards() -> None:
    cards = parse_model_cards(REAL)
    assert cards and all(isinstance(c["id"], str) for c in cards)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>", "non-JSON"),
        (b'{"object": "list"}', "without a `data` list"),
        (b'{"data": [{}]}', "no model"),
    ],
)
def test_other_shapes_are_named(body: bytes, why: str) -> None:
    with pytest.raises(ModelsProbeError, match=why):
        parse_model_cards(body)


def test_describe() -> None:
    assert describe(TimeoutError()) == "timed out"
    assert (
        describe(ModelsProbeError("GET /v1/models answered 503"))
        == "ModelsProbeError: GET /v1/models answered 503"
    )
    assert describe(PageError("cannot connect to 127.0.0.1:9: Connection refused")) == (
        "cannot connect to 127.0.0.1:9: Connection refused"
    )
