"""Request checks: pydantic-style validation errors, vLLM's BadRequestError messages, `--requires` specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.sim.core.requests import RequestError
from corral.sim.http.protocol import parse_chat, parse_completion, parse_json
from corral.sim.weights.requires import Requirement


def test_bad_json_reports_the_position_like_fastapi() -> None:
    with pytest.raises(RequestError) as info:
        parse_json(b'{"model": "x", ')
    err = info.value
    assert (err.status, err.err_type, err.param) == (400, "Bad Request", "body.15")
    assert "'type': 'json_invalid'" in err.message


def test_all_field_errors_are_reported_and_param_names_the_first() -> None:
    with pytest.raises(RequestError) as info:
        parse_chat({"messages": "hi", "max_tokens": "many"})
    err = info.value
    assert err.message.startswith("2 validation errors:\n  {'type': 'list_type', 'loc': 'body.messages'")
    assert "'type': 'int_parsing', 'loc': 'body.max_tokens'" in err.message
    assert err.param == "body.messages"


def test_lax_types_are_accepted_like_pydantic() -> None:
    r = parse_completion({"prompt": "x", "max_tokens": "7", "temperature": 0, "stream": "true"})
    assert (r.max_tokens, r.temperature, r.stream) == (7, 0.0, True)


def test_token_id_prompts_and_max_completion_tokens() -> None:
    assert parse_completion({"prompt": [5, 6, 7]}).prompt_ids == [5, 6, 7]
    chat = parse_chat({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3})
    assert chat.max_tokens == 3


def test_stream_options_need_stream() -> None:
    with pytest.raises(RequestError) as info:
        parse_completion({"prompt": "x", "stream_options": {"include_usage": True}})
    assert (info.value.err_type, info.value.param) == ("BadRequestError", "stream_options")
    assert parse_completion(
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    ).include_usage


@pytest.mark.parametrize(
    ("spec", "kind", "target"),
    [
        ("unix:/run/vineyard.sock", "unix", "/run/vineyard.sock"),
        ("tcp:127.0.0.1:6379", "tcp", "127.0.0.1:6379"),
        ("file:/tmp/ready", "file", "/tmp/ready"),
        ("/tmp/ready", "file", "/tmp/ready"),
    ],
)
def test_requires_specs(spec: str, kind: str, target: str) -> None:
    assert (Requirement.parse(spec).kind, Requirement.parse(spec).target) == (kind, target)


def test_bad_tcp_spec_is_rejected() -> None:
    with pytest.raises(ValueError, match="tcp:HOST:PORT"):
        Requirement.parse("tcp:localhost")


async def test_requirement_checks(tmp_path: Path) -> None:
    assert await Requirement.parse(f"{tmp_path}/missing").check() is not None
    assert await Requirement.parse(str(tmp_path)).check() is None
    assert await Requirement.parse(f"unix:{tmp_path}/none.sock").check() is not None
