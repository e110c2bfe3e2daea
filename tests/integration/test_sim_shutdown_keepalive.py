"""A pooled keep-alive connection (every router keeps some) must not hold a stopping simulator up."""

from __future__ import annotations

import http.client
import signal
from urllib.parse import urlparse

from tests.support.procs import start_sim


def test_sigterm_exits_despite_an_idle_keepalive_connection() -> None:
    proc, url = start_sim()
    try:
        parsed = urlparse(url)
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=5)
        conn.request(
            "POST",
            "/v1/completions",
            body=b'{"model": "sim-model", "prompt": "hi", "max_tokens": 2}',
            headers={"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        assert not response.will_close  # the connection stays open, idle, in the pool
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(10) == 0, proc.output()
        conn.close()
    finally:
        proc.stop()
