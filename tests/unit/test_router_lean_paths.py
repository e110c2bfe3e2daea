"""Which requests the lean server (`--http-server lean`) answers itself: the app's own inference POST
routes, as plain paths; anything aiohttp would rewrite before routing, or answers itself, is handed on."""

from __future__ import annotations

import pytest

from corral.router.app import HOT_PATH, RouterConfig, build_app
from corral.router.serving.server import LeanServer


@pytest.fixture(scope="module")
def server() -> LeanServer:
    app = build_app(RouterConfig(backends=("http://127.0.0.1:9",)))
    return LeanServer(app[HOT_PATH], None, lambda: None, None)  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    "target",
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/v1/audio/transcriptions"],
)
def test_inference_posts_are_the_lean_servers(server: LeanServer, target: str) -> None:
    assert server.serves(target)


@pytest.mark.parametrize(
    "target",
    [
        "/v1/load_lora_adapter",  # one engine's: the app answers 404
        "/v1/models",  # the router's own
        "/v1/fleet",  # an admin route
        "/metrics",
        "/health",
        "/v1/chat/completions?stream=1",  # a query: routed by aiohttp as it parses it
        "/v1/%63ompletions",  # percent-escapes, dot segments and empty segments are rewritten by yarl
        "/v1/../metrics",
        "/v1//completions",
        "http://other.example/v1/completions",  # absolute-form: the proxy's 400
        "/v1/compl\u00e9tions",
    ],
)
def test_everything_else_is_handed_to_aiohttp(server: LeanServer, target: str) -> None:
    assert not server.serves(target)
