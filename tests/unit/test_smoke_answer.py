"""The smoke answer must be a real completion of the model asked (`checks/smoke_answer.py`): not an
error body, the model named, a choice with text; anything else is said for what it is."""

from __future__ import annotations

import orjson
import pytest

from corral.supervisor.checks.smoke_answer import NotACompletion, completion_of


def completion(**fields: object) -> bytes:
    body: dict[str, object] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": " Paris", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    body.update(fields)
    return orjson.dumps(body)


def test_a_completion_of_the_model_is_its_text_and_tokens() -> None:
    assert completion_of(completion(), "m") == (" Paris", 1)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (completion(model="other"), "from model 'other', not 'm'"),
        (completion(choices=[]), "no choices"),
        (completion(choices=[{"index": 0, "text": ""}]), "empty text"),
        (completion(object="chat.completion"), "not 'text_completion'"),
        (orjson.dumps({"error": {"message": "boom"}}), "error body"),
        (b"not json", "not JSON"),
        (b"[]", "not an object"),
    ],
)
def test_anything_else_is_not_ready_saying_what_it_was(raw: bytes, said: str) -> None:
    with pytest.raises(NotACompletion) as caught:
        completion_of(raw, "m")
    assert said in str(caught.value)
