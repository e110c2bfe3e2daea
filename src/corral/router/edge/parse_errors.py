"""What the router logs about requests its HTTP parser refused: one short line each, without the bytes.

aiohttp answers a malformed request (smuggling shapes, NUL bytes, over-long lines) with 400 by itself,
then logs it at ERROR with a traceback and the offending line, which can carry a client's credential
and lets any client write ten log lines per bad request. `ParseErrorLog` keeps one WARNING line
naming the problem, at most `per_second` of them a second, and says how many it left out.
"""

from __future__ import annotations

import logging
import time

from aiohttp.http_exceptions import HttpProcessingError

LINE = "refused a malformed request from %s with %d: %s%s"


class ParseErrorLog(logging.Filter):
    """A filter for the `aiohttp.server` logger; other records pass unchanged. The router's lean server
    (corral.router.serving) logs its own refusals with `note` and `LINE`."""

    def __init__(self, per_second: int = 5) -> None:
        super().__init__()
        self._per_second = per_second
        self._second = 0
        self._logged = 0
        self._suppressed = 0

    def note(self) -> str | None:
        """Count one refused request: None when this second's lines are spent, else what the line
        adds about those left out since the last one."""
        second = int(time.monotonic())
        if second != self._second:
            self._second, self._logged = second, 0
        if self._logged >= self._per_second:
            self._suppressed += 1
            return None
        self._logged += 1
        more = f" ({self._suppressed} more since the last such line)" if self._suppressed else ""
        self._suppressed = 0
        return more

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        more = self.note()
        if more is None:
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "a client"
        # aiohttp's message is "<what>:\n\n  b'<the offending bytes>'": keep only the what
        what = (exc.message or type(exc).__name__).split(":", 1)[0].strip()
        record.msg = LINE
        record.args = (peer, exc.code or 400, what, more)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True
