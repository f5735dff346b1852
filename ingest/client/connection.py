"""One connection to one broker: framing, pipelining, timeouts, negotiation, TLS, SASL.

A ``BrokerConnection`` is single-owner: one thread uses it at a time, and it
starts no thread of its own. Sockets are blocking with timeouts taken from
per-request deadlines. Several requests may be in flight; Kafka answers them
in order, so a response whose correlation id is not the oldest in flight (out
of order, or never sent) is a protocol error that closes the connection, as is
any frame that cannot be decoded or that announces more than
``max_frame_size`` bytes (refused before anything is allocated). A request
timeout also closes the connection: a late answer would desynchronise it.

Buffer lifetime. Decoded Fetch responses hold ``records`` as memoryview slices
of the frame they came from, never copies. By default every frame is read
into its own exactly-sized ``bytearray`` (one copy, from the kernel), so a
response stays valid for as long as it is referenced. ``receive(borrow=True)``
(opt-in, for the fetch loop) reads into the connection's reusable buffer
instead: the response is valid until the next receive on this connection. As
a guard, the buffer is only reused once nothing references it any more (its
reference count is back to the connection's own), so a caller that keeps a
borrowed response costs a fresh allocation rather than seeing it overwritten.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import ssl
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ingest.client.backoff import Backoff
from ingest.client.client_config import ClientConfig, SaslConfig
from ingest.client.scram import mechanism_for, sasl_failure
from ingest.client.versions import Negotiation, negotiate
from ingest.errors import (
    DecodeError,
    KafkaConnectionError,
    ProtocolError,
    RequestTimeoutError,
)
from ingest.protocol.codec import API_NAMES, SUPPORTED_VERSIONS, decode_response, encode_request
from ingest.protocol.error_codes import ErrorCode, raise_for_error
from ingest.protocol.messages import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from ingest.protocol.schema import Request, Response

__all__ = ["BrokerConnection", "InFlight", "expect_response"]

log = logging.getLogger("ingest.client")

R = TypeVar("R", bound=Response)

_MAX_CORRELATION_ID = 2**31 - 1
# References to the reusable buffer when nothing else holds it: the attribute,
# the local variable and getrefcount's own argument.
_UNSHARED_REFS = 3


@dataclass(frozen=True, slots=True)
class InFlight:
    """A request sent and not yet answered; ``receive(ticket)`` gets its response."""

    correlation_id: int
    api_key: int
    version: int
    timeout: float
    deadline: float

    @property
    def api_name(self) -> str:
        return API_NAMES.get(self.api_key, f"api{self.api_key}")


def expect_response(response: Response, expected: type[R], context: str) -> R:
    """``response`` as ``expected``, or a ProtocolError naming where it came from."""
    if not isinstance(response, expected):
        raise ProtocolError(
            f"{context}: expected {expected.__name__}, decoded {type(response).__name__}"
        )
    return response


class BrokerConnection:
    """One TCP (optionally TLS) connection to one broker. Not thread-safe: single owner."""

    def __init__(
        self,
        host: str,
        port: int,
        config: ClientConfig,
        *,
        node_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.config = config
        self._clock = clock
        self._sleep = sleep
        self._sock: socket.socket | None = None
        self._in_flight: deque[InFlight] = deque()
        # Responses read while waiting for a later one (always in owned buffers).
        self._completed: dict[int, Response] = {}
        # Requests whose responses nobody will collect: dropped when they arrive.
        self._abandoned: set[int] = set()
        self._next_id = 1
        self._size_buf = bytearray(4)
        self._borrow_buf: bytearray | None = None
        self._tls_context: ssl.SSLContext | None = None
        self.negotiation: Negotiation | None = None
        self.backoff = Backoff(
            config.reconnect_backoff,
            config.reconnect_backoff_max,
            jitter=config.backoff_jitter,
            clock=clock,
            rand=rand,
        )
        self.connects = 0

    # -- naming ---------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def describe(self) -> str:
        node = f"node {self.node_id}" if self.node_id is not None else "bootstrap"
        return f"broker {self.address} ({node})"

    def _context(self, api_key: int, version: int) -> str:
        return f"{self.describe()}, {API_NAMES.get(api_key, f'api{api_key}')} v{version}"

    def __repr__(self) -> str:
        state = "connected" if self.connected else "closed"
        return f"BrokerConnection({self.describe()}, {state}, in_flight={len(self._in_flight)})"

    # -- lifecycle ------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def tls_version(self) -> str | None:
        """The negotiated TLS version ("TLSv1.3"), or None on a plain connection."""
        if isinstance(self._sock, ssl.SSLSocket):
            return self._sock.version()
        return None

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def ensure_connected(self, *, within: float | None = None) -> None:
        """Connects unless connected, first waiting out the reconnect backoff; with
        ``within``, the TCP connect waits at most that long and a backoff longer than it
        fails at once (retriable)."""
        if self._sock is not None:
            return
        wait = self.backoff.remaining()
        if within is not None and wait >= within:
            raise KafkaConnectionError(
                f"{self.describe()}: reconnect backoff ({wait:.3f}s) outlasts the "
                f"{within:.3f}s left"
            )
        if wait > 0:
            self._sleep(wait)
        self.connect(within=None if within is None else within - wait)

    def connect(self, *, within: float | None = None) -> None:
        """TCP, then TLS, then ApiVersions, then SASL: one attempt, within the timeouts
        (the TCP and TLS connect within ``within`` too, when given)."""
        if self._sock is not None:
            return
        try:
            self._sock = self._open_socket(within)
            self._negotiate()
            if self.config.sasl is not None:
                self._authenticate(self.config.sasl)
        except BaseException:
            self.close()
            self.backoff.failed()
            raise
        self.backoff.succeeded()
        self.connects += 1
        log.debug("%s: connected (connect #%d)", self.describe(), self.connects)

    def _open_socket(self, within: float | None = None) -> socket.socket:
        timeout = self.config.connect_timeout
        if within is not None:
            timeout = max(min(timeout, within), 0.001)
        deadline = self._clock() + timeout
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise KafkaConnectionError(
                f"{self.describe()}: cannot connect: {exc.strerror or exc}"
            ) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.config.tls is None:
                return sock
            if self._tls_context is None:
                self._tls_context = self.config.tls.context()
            sock.settimeout(max(deadline - self._clock(), 0.001))
            return self._tls_context.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            error = KafkaConnectionError(
                f"{self.describe()}: TLS certificate verification failed: "
                f"{exc.verify_message or exc.reason}"
            )
            # A wrong certificate does not fix itself by retrying.
            error.retriable = False
            raise error from None
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            what = "TLS handshake failed" if isinstance(exc, ssl.SSLError) else "socket error"
            if isinstance(exc, TimeoutError):
                what = f"TLS handshake timed out after {timeout:.1f}s"
            raise KafkaConnectionError(f"{self.describe()}: {what}: {exc}") from None

    def close(self, reason: str | None = None) -> None:
        """Closes the socket; requests in flight are abandoned."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            if reason:
                log.info("%s: closed: %s", self.describe(), reason)
        self._in_flight.clear()
        self._completed.clear()
        self._abandoned.clear()

    def __enter__(self) -> BrokerConnection:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- negotiation and authentication --------------------------------------------

    def _negotiate(self) -> None:
        api_key = ApiVersionsRequest.api_key
        version = SUPPORTED_VERSIONS[api_key][1]
        request = ApiVersionsRequest(
            client_software_name=self.config.client_software_name,
            client_software_version=self.config.client_software_version,
        )
        response = self._api_versions(request, version)
        if response.error_code == ErrorCode.UNSUPPORTED_VERSION:
            # The broker answered in v0 with its own ranges; v0 is what every broker speaks.
            log.debug("%s: ApiVersions v%d unsupported, retrying at v0", self.describe(), version)
            version = 0
            response = self._api_versions(ApiVersionsRequest(), version)
        raise_for_error(response.error_code, context=self._context(api_key, version))
        broker = {api.api_key: (api.min_version, api.max_version) for api in response.api_keys}
        self.negotiation = negotiate(broker, api_versions_version=version)
        log.debug("%s: negotiated versions\n%s", self.describe(), self.negotiation.table())

    def _api_versions(self, request: ApiVersionsRequest, version: int) -> ApiVersionsResponse:
        ticket = self.send(request, version=version)
        response = self.receive(ticket)
        return expect_response(
            response, ApiVersionsResponse, self._context(ticket.api_key, ticket.version)
        )

    def _authenticate(self, sasl: SaslConfig) -> None:
        ticket = self.send(SaslHandshakeRequest(mechanism=sasl.mechanism))
        context = self._context(ticket.api_key, ticket.version)
        handshake = expect_response(self.receive(ticket), SaslHandshakeResponse, context)
        if handshake.error_code:
            offered = ", ".join(handshake.mechanisms) or "none"
            raise_for_error(
                handshake.error_code,
                context=context,
                message=f"{sasl.mechanism} was refused; the broker offers: {offered}",
            )
        auth_version = self.version_for(SaslAuthenticateRequest.api_key)
        context = self._context(SaslAuthenticateRequest.api_key, auth_version)
        mechanism = mechanism_for(sasl, context=context)
        token: bytes | None = mechanism.start()
        while token is not None:
            ticket = self.send(SaslAuthenticateRequest(auth_bytes=token))
            response = expect_response(self.receive(ticket), SaslAuthenticateResponse, context)
            if response.error_code:
                raise_for_error(
                    response.error_code,
                    context=context,
                    message=response.error_message or f"{sasl.mechanism} authentication failed",
                )
            token = mechanism.step(response.auth_bytes)
        if not mechanism.complete:
            raise sasl_failure(f"{sasl.mechanism} exchange ended early", context=context)
        log.debug("%s: authenticated as %r with %s", self.describe(), sasl.username, sasl.mechanism)

    def version_for(self, api_key: int) -> int:
        """The negotiated version of ``api_key``; UnsupportedVersionError names both ranges."""
        if self.negotiation is None:
            raise KafkaConnectionError(f"{self.describe()}: not connected (no negotiated versions)")
        return self.negotiation.version_for(api_key, broker=self.describe())

    # -- requests -------------------------------------------------------------------

    def send(
        self, request: Request, *, version: int | None = None, timeout: float | None = None
    ) -> InFlight:
        """Writes one request; its response is read later with ``receive``."""
        if self._sock is None:
            raise KafkaConnectionError(f"{self.describe()}: not connected")
        api_key = type(request).api_key
        if version is None:
            version = self.version_for(api_key)
        correlation_id = self._next_id
        self._next_id = 0 if correlation_id >= _MAX_CORRELATION_ID else correlation_id + 1
        frame = encode_request(
            request, version=version, correlation_id=correlation_id, client_id=self.config.client_id
        )
        timeout = self.config.request_timeout if timeout is None else timeout
        ticket = InFlight(correlation_id, api_key, version, timeout, self._clock() + timeout)
        self._send_frame(frame, ticket)
        self._in_flight.append(ticket)
        return ticket

    def request(
        self,
        request: Request,
        *,
        version: int | None = None,
        timeout: float | None = None,
        borrow: bool = False,
    ) -> Response:
        """Sends and waits for the response (other requests may be in flight)."""
        return self.receive(self.send(request, version=version, timeout=timeout), borrow=borrow)

    def receive(self, ticket: InFlight | None = None, *, borrow: bool = False) -> Response:
        """The response to ``ticket`` (default: the oldest request in flight).

        Responses to older requests read on the way are kept for their own
        ``receive``. ``borrow=True`` reads into the reusable buffer: the response
        is then valid only until the next receive on this connection.
        """
        if ticket is not None:
            done = self._completed.pop(ticket.correlation_id, None)
            if done is not None:
                return done
            if all(t.correlation_id != ticket.correlation_id for t in self._in_flight):
                raise KafkaConnectionError(
                    f"{self._context(ticket.api_key, ticket.version)}: correlation id "
                    f"{ticket.correlation_id} is not in flight (the connection was closed)"
                )
        elif not self._in_flight:
            raise KafkaConnectionError(f"{self.describe()}: no request in flight")
        while True:
            head = self._in_flight[0]
            wanted = ticket is None or head.correlation_id == ticket.correlation_id
            response = self._read_response(head, borrow=borrow and wanted)
            self._in_flight.popleft()
            if wanted:
                return response
            if head.correlation_id in self._abandoned:
                self._abandoned.discard(head.correlation_id)
            else:
                self._completed[head.correlation_id] = response

    def abandon(self, ticket: InFlight) -> None:
        """Gives up on ``ticket``: its response is dropped whenever it arrives."""
        if self._completed.pop(ticket.correlation_id, None) is not None:
            return
        if any(t.correlation_id == ticket.correlation_id for t in self._in_flight):
            self._abandoned.add(ticket.correlation_id)

    # -- framing --------------------------------------------------------------------

    def _read_response(self, head: InFlight, *, borrow: bool) -> Response:
        frame = self._read_frame(head, borrow=borrow)
        context = self._context(head.api_key, head.version)
        correlation_id = int.from_bytes(frame[:4], "big", signed=True)
        if correlation_id != head.correlation_id:
            known = any(t.correlation_id == correlation_id for t in self._in_flight)
            what = "out of order" if known else "that was never sent"
            self.close(f"correlation id {correlation_id} {what}")
            raise ProtocolError(
                f"{context}: response with correlation id {correlation_id} {what}; "
                f"expected {head.correlation_id} (the connection was closed)"
            )
        try:
            _, response = decode_response(head.api_key, head.version, frame)
        except DecodeError as exc:
            self.close(f"undecodable {head.api_name} response")
            raise DecodeError(
                f"{context}: {exc.reason} (the connection was closed)",
                offset=exc.offset,
                field=exc.field,
            ) from None
        return response

    def _read_frame(self, head: InFlight, *, borrow: bool) -> memoryview:
        self._recv_into(memoryview(self._size_buf), head)
        size = int.from_bytes(self._size_buf, "big", signed=True)
        limit = self.config.max_frame_size
        if not 4 <= size <= limit:
            context = self._context(head.api_key, head.version)
            self.close(f"bad frame size {size}")
            if size > limit:
                raise ProtocolError(
                    f"{context}: the broker announced a {size}-byte frame, above max_frame_size "
                    f"{limit} (the connection was closed)"
                )
            raise ProtocolError(
                f"{context}: the broker announced a {size}-byte frame, too short for a "
                "response header (the connection was closed)"
            )
        buffer = self._reusable_buffer(size) if borrow else bytearray(size)
        view = memoryview(buffer)[:size]
        self._recv_into(view, head)
        return view

    def _reusable_buffer(self, size: int) -> bytearray:
        buffer = self._borrow_buf
        if buffer is None or len(buffer) < size or sys.getrefcount(buffer) > _UNSHARED_REFS:
            # Too small, or a borrowed response still holds it: never overwrite live views.
            grown = max(size, len(buffer)) if buffer is not None else size
            buffer = bytearray(grown)
            self._borrow_buf = buffer
        return buffer

    def _recv_into(self, view: memoryview, head: InFlight) -> None:
        sock = self._sock
        if sock is None:
            raise KafkaConnectionError(f"{self.describe()}: not connected")
        while len(view):
            remaining = head.deadline - self._clock()
            try:
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                received = sock.recv_into(view)
            except TimeoutError:
                context = self._context(head.api_key, head.version)
                self.close(f"{head.api_name} timed out")
                raise RequestTimeoutError(
                    f"{context}: no response within {head.timeout:.3g}s "
                    f"(correlation id {head.correlation_id}; the connection was closed)"
                ) from None
            except OSError as exc:
                context = self._context(head.api_key, head.version)
                self.close(f"receive failed: {exc}")
                raise KafkaConnectionError(
                    f"{context}: receive failed: {exc} (correlation id {head.correlation_id})"
                ) from None
            if received == 0:
                context = self._context(head.api_key, head.version)
                self.close("closed by the broker")
                raise KafkaConnectionError(
                    f"{context}: the broker closed the connection while we waited for "
                    f"correlation id {head.correlation_id}"
                )
            view = view[received:]

    def _send_frame(self, frame: bytearray, ticket: InFlight) -> None:
        sock = self._sock
        assert sock is not None
        context = self._context(ticket.api_key, ticket.version)
        try:
            sock.settimeout(max(ticket.deadline - self._clock(), 0.001))
            sock.sendall(frame)
        except TimeoutError:
            self.close(f"{ticket.api_name} send timed out")
            raise RequestTimeoutError(
                f"{context}: could not send within {ticket.timeout:.3g}s (the connection was closed)"
            ) from None
        except OSError as exc:
            self.close(f"send failed: {exc}")
            raise KafkaConnectionError(f"{context}: send failed: {exc}") from None
