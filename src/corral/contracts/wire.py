"""What every wire model shares: unknown fields from a newer peer are ignored, field names are the
JSON names (a Python keyword gets an alias), and a validation failure reads as the first message a
field validator raised, so a server can answer it verbatim."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError


class WireModel(BaseModel):
    """A body on the wire. `encode` writes it as compact JSON under its wire names."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    def encode(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict (enums as their values), for a body that embeds this one."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def decode(cls, raw: bytes | str) -> Self:
        """Parse and validate JSON text; `ValidationError` when it is not this body."""
        return cls.model_validate_json(raw)


class OpenWireModel(WireModel):
    """A body whose fields beyond the typed ones are kept (and written back) as they came."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


def first_message(exc: ValidationError) -> str:
    """The message of the first failed field: what a field validator raised, as it said it."""
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, Exception):
            return str(cause)
        where = ".".join(str(p) for p in error.get("loc", ()))
        return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))
    return str(exc)
