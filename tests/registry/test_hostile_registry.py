"""A registry answer is untrusted input: the client sends its credentials to the registry's
own origin only, never across a redirect, and reads at most ``MAX_ANSWER_BYTES`` of an
answer. A real registry (Apicurio) never redirects or answers 17 MiB, so the peer here is a
scripted HTTP server on loopback that does what a hostile or hijacked one would."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ingest.client import Secret
from ingest.errors import RegistryError
from ingest.registry import MAX_ANSWER_BYTES, RegistryClient, RegistrySettings

SCHEMA = {"schema": '{"type": "string"}'}
Answer = Callable[[http.server.BaseHTTPRequestHandler], None]


class Peer:
    """An HTTP server on ``host`` that answers every GET with ``answer`` and keeps the
    headers of each request it got."""

    def __init__(self, host: str, answer: Answer) -> None:
        seen: list[dict[str, str]] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(dict(self.headers.items()))
                answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for peer in made:
        peer.close()


def _json(status: int, body: bytes) -> Answer:
    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def _redirect(to: str) -> Answer:
    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", to + handler.path)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def _client(url: str, **settings: Any) -> RegistryClient:
    return RegistryClient(
        RegistrySettings(urls=(url,), request_timeout=5.0, retry_timeout=1.0, **settings)
    )


@pytest.mark.parametrize(
    "credentials",
    [
        {"bearer_token": Secret("the-token")},
        {"basic_auth_user": "u", "basic_auth_password": Secret("the-password")},
    ],
)
def test_credentials_never_follow_a_redirect_to_another_origin(
    peers: list[Peer], credentials: dict[str, Any]
) -> None:
    elsewhere = Peer("127.0.0.2", _json(200, json.dumps(SCHEMA).encode()))
    peers.append(elsewhere)
    registry = Peer("127.0.0.1", _redirect(elsewhere.url))
    peers.append(registry)

    found = _client(registry.url, **credentials).schema(1)

    assert found.text == SCHEMA["schema"]  # the redirect is followed, without credentials
    assert "Authorization" in registry.seen[0]  # the registry's own origin gets them
    assert [h for h in elsewhere.seen if "Authorization" in h] == []


def test_an_answer_over_the_cap_is_refused_not_read_whole(peers: list[Peer]) -> None:
    padding = "x" * (MAX_ANSWER_BYTES + 1)
    registry = Peer("127.0.0.1", _json(200, json.dumps({"schema": padding}).encode()))
    peers.append(registry)

    with pytest.raises(RegistryError) as info:
        _client(registry.url).schema(1)
    assert f"over {MAX_ANSWER_BYTES} bytes" in str(info.value)
    assert not info.value.retriable


def test_an_error_answer_is_read_for_its_message_only(peers: list[Peer]) -> None:
    detail = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
    registry = Peer("127.0.0.1", _json(404, detail))
    peers.append(registry)

    with pytest.raises(RegistryError) as info:
        _client(registry.url).schema(7)
    assert "HTTP 404: Schema not found" in str(info.value) and info.value.code == 40403
