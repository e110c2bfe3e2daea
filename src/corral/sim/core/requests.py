"""What the engine is asked (`InferenceRequest`) and how it refuses (`RequestError`: the HTTP status,
message, OpenAI error type and parameter the API answers with)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RequestError(Exception):
    """An error answer: HTTP status, message, OpenAI error type and the offending parameter."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


def bad_request(message: str, param: str, value: Any) -> RequestError:
    return RequestError(400, f"{message} (parameter={param}, value={value})", "BadRequestError", param)


@dataclass(frozen=True)
class InferenceRequest:
    """What the engine needs from a chat or text completion request."""

    chat: bool
    model: str | None
    prompt_text: str | None
    prompt_ids: list[int] | None
    max_tokens: int | None
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's P/D fields (engine/pd_protocol.py)
