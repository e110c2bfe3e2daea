"""The one way a generated docs page is written or checked: `write_or_check(page, text, argv, script)`
writes `text` to `page`, or, with `--check` in `argv`, changes nothing and exits 1 if the page differs."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(page: Path, text: str, argv: list[str], script: str) -> int:
    if "--check" in argv:
        if not page.exists() or page.read_text(encoding="utf-8") != text:
            print(f"{page} is stale: run {script}", file=sys.stderr)
            return 1
        return 0
    page.write_text(text, encoding="utf-8")
    print(f"wrote {page}")
    return 0
