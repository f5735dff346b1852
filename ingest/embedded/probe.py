"""Is a Kafka broker ready? It is once it answers ApiVersions, not when its port accepts:
brokers bind before they can serve (Tansu before its storage is usable, Kafka before its
metadata is loaded)."""

from __future__ import annotations

import socket
import struct

from ingest.errors import DecodeError
from ingest.protocol import codec
from ingest.protocol.messages import ApiVersionsRequest, ApiVersionsResponse

__all__ = ["api_versions_answered"]


def api_versions_answered(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """Sends ApiVersions v0 and checks for a well-formed, error-free answer."""
    correlation_id = 0x1D1D
    frame = codec.encode_request(
        ApiVersionsRequest(), version=0, correlation_id=correlation_id, client_id="ingest-harness"
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(frame)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        if not 6 <= size <= 1 << 20:
            return False
        body = _recv_exact(sock, size)
    try:
        header, response = codec.decode_response(ApiVersionsRequest.api_key, 0, memoryview(body))
    except DecodeError:
        return False
    return (
        isinstance(response, ApiVersionsResponse)
        and header.correlation_id == correlation_id
        and response.error_code == 0
        and len(response.api_keys) > 0
    )


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("peer closed during ApiVersions")
        chunks += chunk
    return bytes(chunks)
