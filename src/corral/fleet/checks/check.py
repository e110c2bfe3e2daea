"""One line of the post-operation checklist: a named check, its verdict (pass, fail, warn, not
measured) and its evidence in one line. Check names are stable; the table, the change record and the
tests name them."""

from __future__ import annotations

from dataclasses import dataclass

PASS, FAIL, WARN = "pass", "fail", "warn"
NOT_MEASURED = "not measured"  # nothing could measure it: never a pass; fails with --require-measured


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"check": self.name, "verdict": self.verdict, "detail": self.detail}
