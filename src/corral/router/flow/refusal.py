"""How flow control refuses a request: a status, words a client can act on, OpenAI's error type and the
`Retry-After` seconds; the proxy answers it in OpenAI's error shape (corral.openai_errors)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int  # 400 (a bad flow header) or 429 (held back)
    message: str
    err_type: str
    param: str | None = None  # the header at fault
    retry_after: int | None = None

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
