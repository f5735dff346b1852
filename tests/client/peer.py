"""Scripted peers: a listening socket on 127.0.0.1 whose connections a test script serves.

A peer is where a test controls what a "broker" does wrong: never answer,
answer out of order, send garbage or a huge frame. Requests are decoded and
responses encoded with ingest's own codec, so what goes over the wire is real
Kafka framing. Each accepted connection runs the script in its own thread.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from ingest.protocol.codec import SUPPORTED_VERSIONS, decode_request, encode_response
from ingest.protocol.headers import RequestHeader
from ingest.protocol.messages import (
    ApiVersion,
    ApiVersionsResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from ingest.protocol.schema import Request, Response

UNSUPPORTED_VERSION = 35


class PeerConnection:
    """One accepted connection, seen from the scripted broker's side."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def read_exact(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise EOFError("client closed")
            data += chunk
        return bytes(data)

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.read_exact(4))
        return self.read_exact(size)

    def read_request(self) -> tuple[RequestHeader, Request]:
        return decode_request(self.read_frame())

    def send_response(self, response: Response, header: RequestHeader) -> None:
        self.sock.sendall(
            encode_response(
                response, version=header.request_api_version, correlation_id=header.correlation_id
            )
        )

    def send_raw(self, data: bytes | bytearray | memoryview) -> None:
        self.sock.sendall(data)


Script = Callable[[PeerConnection], None]


class ScriptedPeer:
    """``with ScriptedPeer(script) as peer:`` listens on ``peer.port`` until the block ends."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.host = "127.0.0.1"
        self.errors: list[BaseException] = []
        self.accepted = 0
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __enter__(self) -> ScriptedPeer:
        thread = threading.Thread(target=self._accept_loop, name="scripted-peer", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._sockets.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, sock: socket.socket) -> None:
        try:
            self.script(PeerConnection(sock))
        except (EOFError, OSError):
            pass  # the client closed: the normal end of most scripts
        except BaseException as exc:  # a broken script must fail the test, not vanish
            self.errors.append(exc)
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing.set()
        # shutdown() wakes the thread blocked in accept(); close() alone would not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(5)
        if self.errors and exc_type is None:
            raise AssertionError(f"scripted peer failed: {self.errors[0]!r}") from self.errors[0]


# -- a scripted Kafka broker ---------------------------------------------------------

Handler = Callable[[PeerConnection, RequestHeader, Any], "Response | bytes | bytearray | None"]


def api_versions(ranges: Mapping[int, tuple[int, int]]) -> tuple[ApiVersion, ...]:
    return tuple(
        ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ranges.items())
    )


def kafka_script(
    handlers: Mapping[int, Handler],
    *,
    ranges: Mapping[int, tuple[int, int]] | None = None,
    api_versions_max: int = 3,
    seen: list[tuple[int, int]] | None = None,
) -> Script:
    """A broker that answers ApiVersions itself and other APIs through ``handlers``.

    ``ranges`` are the versions it advertises (default: exactly ours). An
    ApiVersions request above ``api_versions_max`` gets UNSUPPORTED_VERSION in
    v0, as Kafka answers. A handler returns a response (encoded at the request's
    version), raw bytes (sent as they are) or None (no answer). ``seen`` collects
    (api_key, version) of every request.
    """
    advertised = dict(SUPPORTED_VERSIONS if ranges is None else ranges)

    def script(peer: PeerConnection) -> None:
        while True:
            header, request = peer.read_request()
            if seen is not None:
                seen.append((header.request_api_key, header.request_api_version))
            if header.request_api_key == 18:
                if header.request_api_version > api_versions_max:
                    refusal = ApiVersionsResponse(
                        error_code=UNSUPPORTED_VERSION, api_keys=api_versions(advertised)
                    )
                    peer.send_raw(
                        encode_response(refusal, version=0, correlation_id=header.correlation_id)
                    )
                else:
                    peer.send_response(
                        ApiVersionsResponse(api_keys=api_versions(advertised)), header
                    )
                continue
            handler = handlers.get(header.request_api_key)
            if handler is None:
                raise AssertionError(f"the script has no handler for api {header.request_api_key}")
            answer = handler(peer, header, request)
            if answer is None:
                continue
            if isinstance(answer, bytes | bytearray | memoryview):
                peer.send_raw(answer)
            else:
                peer.send_response(answer, header)

    return script


# -- the server side of SASL (RFC 4616 PLAIN, RFC 5802 SCRAM) -----------------------


class SaslServer:
    """Server-side SASL for scripted peers: verifies PLAIN, runs SCRAM per RFC 5802.

    ``server_knows`` is the password the server holds; ``forge_signature`` makes
    the server send a wrong ServerSignature (a server that does not really know
    the password), which the client must reject.
    """

    def __init__(
        self,
        *,
        username: str,
        server_knows: str,
        mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        iterations: int = 4096,
        forge_signature: bool = False,
    ) -> None:
        self.username = username
        self.password = server_knows
        self.mechanisms = mechanisms
        self.iterations = iterations
        self.forge_signature = forge_signature
        self.mechanism: str | None = None
        self.authenticated = False
        self._step = 0
        self._client_first_bare = b""
        self._server_first = b""
        self._nonce = ""
        self._salt = os.urandom(16)

    def handlers(self) -> dict[int, Handler]:
        return {
            SaslHandshakeRequest.api_key: self._handshake,
            SaslAuthenticateRequest.api_key: self._authenticate,
        }

    def _handshake(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Response:
        if request.mechanism not in self.mechanisms:
            return SaslHandshakeResponse(error_code=33, mechanisms=self.mechanisms)
        self.mechanism = request.mechanism
        return SaslHandshakeResponse(error_code=0, mechanisms=self.mechanisms)

    def _fail(self, message: str) -> Response:
        return SaslAuthenticateResponse(error_code=58, error_message=message, auth_bytes=b"")

    def _authenticate(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Response:
        data: bytes = request.auth_bytes
        if self.mechanism == "PLAIN":
            _authzid, user, password = data.split(b"\x00")
            if user.decode() == self.username and password.decode() == self.password:
                self.authenticated = True
                return SaslAuthenticateResponse(error_code=0, auth_bytes=b"")
            return self._fail("Authentication failed: invalid credentials")
        digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[self.mechanism or ""]
        if self._step == 0:
            self._step = 1
            assert data.startswith(b"n,,"), data
            self._client_first_bare = data[3:]
            fields = dict(part.split(b"=", 1) for part in self._client_first_bare.split(b","))
            if fields[b"n"].decode() != self.username:
                return self._fail("Authentication failed: unknown user")
            self._nonce = fields[b"r"].decode() + base64.b64encode(os.urandom(12)).decode()
            self._server_first = (
                f"r={self._nonce},s={base64.b64encode(self._salt).decode()},"
                f"i={self.iterations}".encode()
            )
            return SaslAuthenticateResponse(error_code=0, auth_bytes=self._server_first)
        without_proof, _, proof_text = data.rpartition(b",p=")
        if not without_proof.endswith(f"r={self._nonce}".encode()):
            return self._fail("Authentication failed: nonce mismatch")
        salted = hashlib.pbkdf2_hmac(digest, self.password.encode(), self._salt, self.iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        stored_key = hashlib.new(digest, client_key).digest()
        auth_message = b",".join((self._client_first_bare, self._server_first, without_proof))
        signature = hmac.new(stored_key, auth_message, digest).digest()
        proof = base64.b64decode(proof_text)
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if hashlib.new(digest, recovered).digest() != stored_key:
            return self._fail(
                "Authentication failed during authentication due to invalid credentials"
            )
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        server_signature = hmac.new(server_key, auth_message, digest).digest()
        if self.forge_signature:
            server_signature = bytes(len(server_signature))
        self.authenticated = True
        return SaslAuthenticateResponse(
            error_code=0, auth_bytes=b"v=" + base64.b64encode(server_signature)
        )
