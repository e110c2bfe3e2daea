"""The supervisor's management API against a web page and a careless client: a mutating request needs
`Content-Type: application/json` (415 otherwise), a request carrying another site's `Origin` is refused
(403), a tokenless (loopback) supervisor refuses a foreign `Host` (DNS rebinding), and the engine it
starts never inherits the management token. Real `corral supervise` over `corral sim` on loopback."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.integration.test_supervisor_support import Supervised, http_json, supervised

TOKEN = "hardening-token-5b1e"
SUP_ARGS = ("--propagation-timeout", "1", "--quiet-period", "0.2")


def raw_request(
    url: str, method: str = "POST", body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """A request exactly as given: urllib adds a form content type to a body unless one is named."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, orjson.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read() or b"null")


def engine_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def still_ready(sup: Supervised, token: str | None = None) -> None:
    status, body = http_json(sup.url + "/v1/state", token=token)
    assert status == 200 and body["state"] == "READY", body
    assert not [op for op in body["operations"] if op["kind"] == "drain"], body["operations"]


def test_a_web_page_cannot_drain_a_tokenless_supervisor() -> None:
    with supervised(sup_args=SUP_ARGS) as sup:
        sup.wait_state("READY")
        drain = sup.url + "/v1/drain"
        # the CSRF of the issue: a form-like text/plain POST, which a browser sends without a preflight
        status, body = raw_request(drain, body=b'{"policy": "abort"}', headers={"Content-Type": "text/plain"})
        assert status == 415, body
        message = body["error"]["message"]
        assert "'text/plain'" in message and "application/json" in message, message
        assert body["error"]["type"] == "invalid_request_error"
        status, body = raw_request(drain, body=None, headers={})  # no body, no content type
        assert status == 415, body
        assert "no Content-Type" in body["error"]["message"]
        still_ready(sup)

        # a JSON POST from another site's page: refused whatever its content type
        for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
            status, body = raw_request(
                drain, body=b"{}", headers={"Content-Type": "application/json", "Origin": origin}
            )
            assert status == 403, (origin, body)
            assert repr(origin) in body["error"]["message"] and body["error"]["type"] == "permission_error"
        # DNS rebinding: the page's own origin, but a Host that is not this machine
        rebound = {
            "Content-Type": "application/json",
            "Host": "evil.example:80",
            "Origin": "http://evil.example:80",
        }
        status, body = raw_request(drain, body=b"{}", headers=rebound)
        assert status == 403, body
        status, body = raw_request(sup.url + "/v1/state", "GET", headers={"Host": "evil.example"})
        assert status == 403 and "evil.example" in body["error"]["message"], body
        still_ready(sup)

        # what is allowed: the supervisor's own origin, a JSON content type with parameters, no Origin
        own = sup.url  # http://127.0.0.1:PORT, which is also the Host a client sends
        assert raw_request(own + "/v1/state", "GET", headers={"Origin": own})[0] == 200
        # probes stay plain for kubelets and load balancers, whatever they send
        assert raw_request(own + "/readyz", "GET", headers={"Origin": "http://evil.example"})[0] == 200
        status, body = raw_request(
            drain,
            body=b'{"operation_id": "cli-drain"}',
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert status == 202 and body["operation_id"] == "cli-drain", body


def test_a_token_supervisor_checks_content_type_and_origin_too_and_its_engine_never_sees_the_token(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    env = {"CORRAL_TOKEN": TOKEN, "CORRAL_TOKEN_FILE": str(token_file), "KEEP_ME": "1"}
    with supervised(sup_args=(*SUP_ARGS, "--token-file", str(token_file)), env=env) as sup:
        sup.wait_for(
            "READY", lambda _: http_json(sup.url + "/v1/state", token=TOKEN)[1]["state"] == "READY", 30
        )
        pid = http_json(sup.url + "/v1/state", token=TOKEN)[1]["engine"]["pid"]
        environ = engine_environ(pid)
        assert "CORRAL_TOKEN" not in environ and "CORRAL_TOKEN_FILE" not in environ, sorted(environ)
        assert environ.get("KEEP_ME") == "1"  # the rest of the environment is inherited as before
        assert TOKEN not in Path(f"/proc/{pid}/environ").read_text(errors="replace")
        assert os.environ.get("CORRAL_TOKEN") != TOKEN  # the test itself did not leak it into its own env

        drain = sup.url + "/v1/drain"
        status, body = raw_request(drain, body=b"{}", headers={**auth, "Content-Type": "text/plain"})
        assert status == 415, body
        status, body = raw_request(
            drain,
            body=b"{}",
            headers={**auth, "Content-Type": "application/json", "Origin": "https://a.example"},
        )
        assert status == 403, body
        # a foreign Host is fine with a token: the token, not the name, is what proves the caller
        status, _ = raw_request(sup.url + "/v1/state", "GET", headers={**auth, "Host": "sup.internal:8081"})
        assert status == 200
        still_ready(sup, TOKEN)
        assert raw_request(drain, body=b"{}", headers={"Content-Type": "application/json"})[0] == 401
        status, body = raw_request(drain, body=b"{}", headers={**auth, "Content-Type": "application/json"})
        assert status == 202, body
