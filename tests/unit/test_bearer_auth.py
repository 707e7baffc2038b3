"""The frontend's API-key check (`BearerAuthMiddleware`) on a bare ASGI app: which paths it guards, and the
`Authorization` header forms it takes (found by an outside test, 2026-12-03)."""
import types

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from omni_frontend.app import BearerAuthMiddleware
from omni_frontend.auth import accepted_subprotocol, websocket_authorized


def _client() -> TestClient:
    ok = lambda request: PlainTextResponse("ok")  # noqa: E731
    app = Starlette(routes=[Route("/v1/models", ok), Route("/realtime", ok), Route("/health", ok)])
    return TestClient(BearerAuthMiddleware(app, api_key="sekrit"))


@pytest.mark.parametrize("header", ["Bearer sekrit", "bearer sekrit", "BEARER sekrit", "Bearer  sekrit"])
def test_the_scheme_name_is_case_insensitive(header):
    assert _client().get("/v1/models", headers={"Authorization": header}).text == "ok"


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic sekrit", "sekrit", "Bearer", "Bearer sekrit2"])
def test_a_wrong_or_missing_key_is_a_401_envelope(header):
    response = _client().get("/v1/models", headers={"Authorization": header} if header else {})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "hi"}), ("/tokenize", {"prompt": "hi"}),
                                        ("/detokenize", {"tokens": [1]})])
def test_vllms_text_routes_need_the_key(path, body):
    """The real app: vLLM's routes outside /v1 (/tokenize, /detokenize) are guarded as every API route."""
    from omni_frontend.app import create_app
    from omni_frontend.config import FrontendConfig

    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", pipelines=[], api_key="sekrit"))
    with TestClient(app) as client:
        response = client.post(path, json={"model": "voice", **body})
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        response = client.post(path, json={"model": "voice", **body}, headers={"Authorization": "Bearer sekrit"})
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_the_realtime_page_and_health_open_without_a_key():
    """A browser opening the page sends no Authorization header; the page sends the key on the WebSocket."""
    client = _client()
    assert client.get("/realtime").text == "ok" and client.get("/health").text == "ok"


@pytest.mark.parametrize("headers, protocols, ok", [
    ({"authorization": "bearer sekrit"}, [], True),                      # the scheme in any case, as over HTTP
    ({}, ["realtime", "openai-insecure-api-key.sekrit"], True),          # the browser's subprotocol
    ({"authorization": "Bearer wrong"}, ["openai-insecure-api-key.nope"], False),
    ({}, ["realtime"], False)])
def test_the_websockets_take_the_same_key_forms(headers, protocols, ok):
    websocket = types.SimpleNamespace(headers=headers)
    assert websocket_authorized(websocket, "sekrit", protocols) is ok


@pytest.mark.parametrize("protocols, supported, chosen", [
    (["openai-insecure-api-key.sekrit"], (), "openai-insecure-api-key.sekrit"),   # a browser fails a handshake
    (["realtime", "openai-insecure-api-key.sekrit"], ("realtime",), "realtime"),  # naming none it offered
    (["openai-insecure-api-key.sekrit"], ("realtime",), "openai-insecure-api-key.sekrit"),
    (["chat"], ("realtime",), None), ([], ("realtime",), None)])
def test_a_websocket_handshake_names_a_subprotocol_the_client_offered(protocols, supported, chosen):
    assert accepted_subprotocol(protocols, supported) == chosen
