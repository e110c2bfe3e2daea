"""`Expect: 100-continue` at a hardened router: a client the router would refuse is refused *before*
`100 Continue`, so it never uploads a body only to be turned away once it arrived; a client it would
serve is invited and served. Raw sockets, so the test sees exactly which answer comes first."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import orjson
import pytest

from tests.support.procs import CorralProcess, free_port, start_sim

KEY = "expect-tenant-key-0123456789"
BODY = orjson.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 2})


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    keys = tmp_path_factory.mktemp("expect") / "keys.yaml"
    keys.write_text(f"- name: team\n  key: {KEY}\n")
    keys.chmod(0o600)
    sim, sim_url = start_sim(None, "--seed", "0", "--ttft-base-ms", "1", "--itl-ms", "1")
    port = free_port()
    proc = CorralProcess(
        [
            "router",
            "--port",
            str(port),
            "--backend",
            sim_url,
            "--api-keys-file",
            str(keys),
            "--max-body-size",
            "1MiB",
        ]
    )
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        yield port
    finally:
        proc.stop()
        sim.stop()


def first_answer(port: int, head: bytes) -> bytes:
    """Send only the request head (as curl does with Expect) and return what the router says first."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def head(length: int, *extra: str) -> bytes:
    lines = [
        "POST /v1/completions HTTP/1.1",
        "Host: router",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "Expect: 100-continue",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_client_without_a_key_is_refused_before_it_uploads(router: int) -> None:
    answer = first_answer(router, head(len(BODY)))
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    answer = first_answer(router, head(len(BODY), "Authorization: Bearer not-a-key-0123456789"))
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_a_body_over_the_limit_is_refused_before_it_is_sent(router: int) -> None:
    answer = first_answer(router, head(40 << 20, f"Authorization: Bearer {KEY}"))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"--max-body-size" in answer


def test_an_unknown_expectation_is_417(router: int) -> None:
    raw = head(len(BODY), f"Authorization: Bearer {KEY}").replace(b"100-continue", b"something-else")
    answer = first_answer(router, raw)
    assert answer.startswith(b"HTTP/1.1 417"), answer[:200]


def test_a_client_the_router_serves_is_invited_then_answered(router: int) -> None:
    with socket.create_connection(("127.0.0.1", router), timeout=10) as sock:
        sock.sendall(head(len(BODY), f"Authorization: Bearer {KEY}"))
        interim = sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim[:200]
        sock.sendall(BODY)
        received = interim[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
        while b'"usage"' not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    assert b'"text_completion"' in received
