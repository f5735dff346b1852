"""BrokerConnection against scripted peers: framing, pipelining, timeouts, limits, SASL.

Each peer is a real listening socket (tests/client/peer.py) that speaks Kafka
framing through ingest's codec and misbehaves on purpose.
"""

from __future__ import annotations

import gc
import logging
import struct
import time
import traceback
import tracemalloc
from typing import Any

import pytest

from ingest.client import BrokerConnection, ClientConfig, SaslConfig, Secret, TlsConfig
from ingest.errors import (
    BrokerError,
    DecodeError,
    KafkaConnectionError,
    ProtocolError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from ingest.protocol.codec import SUPPORTED_VERSIONS, encode_response
from ingest.protocol.headers import RequestHeader
from ingest.protocol.messages import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FetchableTopicResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FindCoordinatorRequest,
    MetadataRequest,
    MetadataResponse,
    PartitionData,
)
from tests.bounds import REFUSAL_S, TIMEOUT_SLACK_S
from tests.client.peer import (
    PeerConnection,
    SaslServer,
    ScriptedPeer,
    api_versions,
    kafka_script,
)

METADATA = MetadataRequest.api_key
FETCH = FetchRequest.api_key


def make_config(**overrides: Any) -> ClientConfig:
    settings: dict[str, Any] = {
        "connect_timeout": 2.0,
        "request_timeout": 2.0,
        "retry_timeout": 0.0,
        "reconnect_backoff": 0.01,
        "reconnect_backoff_max": 0.05,
    }
    settings.update(overrides)
    return ClientConfig(**settings)


def connection_to(peer: ScriptedPeer, **overrides: Any) -> BrokerConnection:
    return BrokerConnection(peer.host, peer.port, make_config(**overrides), node_id=7)


def reply_with_correlation(peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
    return MetadataResponse(cluster_id=f"reply-{header.correlation_id}", controller_id=1)


# -- negotiation ----------------------------------------------------------------------


def test_negotiates_the_highest_version_both_sides_support() -> None:
    seen: list[tuple[int, int]] = []
    ranges = {**SUPPORTED_VERSIONS, METADATA: (0, 9), FETCH: (4, 17)}
    script = kafka_script({METADATA: reply_with_correlation}, ranges=ranges, seen=seen)
    with ScriptedPeer(script) as peer, connection_to(peer) as conn:
        assert conn.version_for(METADATA) == 9
        assert conn.version_for(FETCH) == SUPPORTED_VERSIONS[FETCH][1]
        response = conn.request(MetadataRequest(topics=()))
        assert isinstance(response, MetadataResponse)
    assert seen[0] == (18, 3)  # ApiVersions at our highest version first
    assert seen[1] == (METADATA, 9)


def test_api_versions_falls_back_to_v0_when_the_broker_refuses_ours() -> None:
    seen: list[tuple[int, int]] = []
    script = kafka_script({}, api_versions_max=2, seen=seen)
    with ScriptedPeer(script) as peer, connection_to(peer) as conn:
        assert conn.negotiation is not None
        assert conn.negotiation.api_versions_version == 0
        assert conn.version_for(METADATA) == SUPPORTED_VERSIONS[METADATA][1]
    assert seen == [(18, 3), (18, 0)]


def test_no_common_version_names_the_api_and_both_ranges() -> None:
    low, high = SUPPORTED_VERSIONS[METADATA]
    ranges = {**SUPPORTED_VERSIONS, METADATA: (high + 1, high + 3)}
    del ranges[FindCoordinatorRequest.api_key]
    with ScriptedPeer(kafka_script({}, ranges=ranges)) as peer, connection_to(peer) as conn:
        with pytest.raises(UnsupportedVersionError) as info:
            conn.send(MetadataRequest(topics=()))
        message = str(info.value)
        assert "Metadata" in message and f"{low}-{high}" in message
        assert f"{high + 1}-{high + 3}" in message and peer.address in message
        with pytest.raises(UnsupportedVersionError, match="does not offer FindCoordinator"):
            conn.version_for(FindCoordinatorRequest.api_key)
        assert conn.connected  # a missing API is not a broken connection


# -- timeouts ---------------------------------------------------------------------------


def never_answer(peer: PeerConnection) -> None:
    while True:
        peer.read_frame()


def test_a_peer_that_accepts_and_never_answers_gets_a_timeout() -> None:
    with ScriptedPeer(never_answer) as peer:
        conn = connection_to(peer, request_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError) as info:
            conn.connect()
        elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 0.3 + TIMEOUT_SLACK_S
    message = str(info.value)
    assert f"broker {peer.address} (node 7)" in message and "ApiVersions v3" in message
    assert not conn.connected
    assert conn.backoff.failures == 1


def test_a_request_timeout_closes_the_connection() -> None:
    script = kafka_script({METADATA: lambda peer, header, request: None})
    with ScriptedPeer(script) as peer, connection_to(peer) as conn:
        ticket = conn.send(MetadataRequest(topics=()), timeout=0.2)
        with pytest.raises(RequestTimeoutError, match=r"Metadata v12: no response within 0.2s"):
            conn.receive(ticket)
        assert not conn.connected
        with pytest.raises(KafkaConnectionError, match="not in flight"):
            conn.receive(ticket)
        with pytest.raises(KafkaConnectionError, match="not connected"):
            conn.send(MetadataRequest(topics=()))


def test_a_silent_tls_peer_hits_the_connect_timeout() -> None:
    with ScriptedPeer(never_answer) as peer:
        conn = connection_to(peer, connect_timeout=0.3, tls=TlsConfig())
        started = time.monotonic()
        with pytest.raises(KafkaConnectionError, match="TLS handshake timed out"):
            conn.connect()
    assert time.monotonic() - started < 0.3 + TIMEOUT_SLACK_S


def test_reconnect_waits_out_the_backoff() -> None:
    sleeps: list[float] = []
    with ScriptedPeer(never_answer) as peer:
        port = peer.port
    # The peer is gone: connecting fails, and each retry first sleeps the backoff.
    conn = BrokerConnection("127.0.0.1", port, make_config(), sleep=sleeps.append, rand=lambda: 0.5)
    for _ in range(3):
        with pytest.raises(KafkaConnectionError, match="cannot connect"):
            conn.ensure_connected()
    assert conn.backoff.failures == 3
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] > 0


# -- bad frames ---------------------------------------------------------------------------


def answer_api_versions_with(data: bytes, *, then_close: bool = False) -> Any:
    def script(peer: PeerConnection) -> None:
        peer.read_frame()
        peer.send_raw(data)
        if not then_close:
            never_answer(peer)  # keep the socket open: the client must not wait for more

    return script


@pytest.mark.parametrize(
    ("data", "error", "text"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", ProtocolError, "above max_frame_size"),
        (struct.pack(">i", 2**31 - 1), ProtocolError, "2147483647-byte frame, above"),
        (struct.pack(">i", -5), ProtocolError, "too short"),
        (struct.pack(">ii", 8, 999) + b"xxxx", ProtocolError, "999 that was never sent"),
        (struct.pack(">ii", 9, 1) + b"\x00\x00\xff\xff\xff", DecodeError, "ApiVersions v3"),
        (struct.pack(">ii", 100, 1) + b"short", KafkaConnectionError, "closed the connection"),
    ],
    ids=["http", "huge", "negative", "unknown-id", "undecodable", "closed-mid-frame"],
)
def test_a_bad_frame_is_a_clear_error_and_a_closed_connection(
    data: bytes, error: type[Exception], text: str
) -> None:
    script = answer_api_versions_with(data, then_close=error is KafkaConnectionError)
    with ScriptedPeer(script) as peer:
        conn = connection_to(peer)
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(error) as info:
                conn.connect()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert time.monotonic() - started < REFUSAL_S, "no hang"
    assert peak < 1_000_000, "nothing was allocated for the announced size"
    assert text in str(info.value)
    assert peer.address in str(info.value)
    assert not conn.connected


def test_the_frame_limit_is_configurable() -> None:
    limit = 1 << 20
    with ScriptedPeer(answer_api_versions_with(struct.pack(">i", limit + 1))) as peer:
        conn = connection_to(peer, max_frame_size=limit)
        with pytest.raises(ProtocolError, match=f"above max_frame_size {limit}"):
            conn.connect()


# -- pipelining -------------------------------------------------------------------------


def answer_in_order(count: int, *, reverse: bool = False) -> Any:
    """Reads ``count`` Metadata requests before answering any, then answers them."""

    def script(peer: PeerConnection) -> None:
        header, _ = peer.read_request()  # ApiVersions, the connection's first request
        peer.send_response(ApiVersionsResponse(api_keys=api_versions(SUPPORTED_VERSIONS)), header)
        waiting = [peer.read_request() for _ in range(count)]
        if reverse:
            waiting.reverse()
        for header, request in waiting:
            peer.send_response(reply_with_correlation(peer, header, request), header)
        never_answer(peer)

    return script


def test_pipelined_requests_are_matched_to_their_responses() -> None:
    with ScriptedPeer(answer_in_order(5)) as peer, connection_to(peer) as conn:
        tickets = [conn.send(MetadataRequest(topics=())) for _ in range(5)]
        assert conn.in_flight == 5
        # Asking for the last one first reads (and keeps) the four before it.
        last = conn.receive(tickets[-1])
        assert isinstance(last, MetadataResponse)
        assert last.cluster_id == f"reply-{tickets[-1].correlation_id}"
        assert conn.in_flight == 0
        for ticket in tickets[:-1]:
            response = conn.receive(ticket)
            assert isinstance(response, MetadataResponse)
            assert response.cluster_id == f"reply-{ticket.correlation_id}"
        assert len({t.correlation_id for t in tickets}) == 5


def test_abandoned_responses_are_dropped_when_they_arrive() -> None:
    with ScriptedPeer(answer_in_order(3)) as peer, connection_to(peer) as conn:
        first, second, third = (conn.send(MetadataRequest(topics=())) for _ in range(3))
        conn.abandon(first)
        response = conn.receive(third)
        assert isinstance(response, MetadataResponse)
        assert response.cluster_id == f"reply-{third.correlation_id}"
        with pytest.raises(KafkaConnectionError, match="not in flight"):
            conn.receive(first)
        conn.abandon(second)  # already read ahead: forgotten at once
        with pytest.raises(KafkaConnectionError, match="not in flight"):
            conn.receive(second)
        assert conn.connected


def test_out_of_order_responses_close_the_connection() -> None:
    with ScriptedPeer(answer_in_order(2, reverse=True)) as peer, connection_to(peer) as conn:
        first = conn.send(MetadataRequest(topics=()))
        second = conn.send(MetadataRequest(topics=()))
        with pytest.raises(ProtocolError) as info:
            conn.receive(first)
        assert f"correlation id {second.correlation_id} out of order" in str(info.value)
        assert f"expected {first.correlation_id}" in str(info.value)
        assert not conn.connected


# -- buffers ----------------------------------------------------------------------------

FRAME_MB = 50


@pytest.fixture(scope="module")
def big_fetch_frame() -> tuple[bytearray, int]:
    """A 50 MB Fetch v12 response frame and the position of its first record byte."""
    size = FRAME_MB * 1024 * 1024
    records = b"\xab" + bytes(size - 1)
    response = FetchResponse(
        responses=(
            FetchableTopicResponse(
                topic="big",
                partitions=(PartitionData(partition_index=0, high_watermark=1, records=records),),
            ),
        )
    )
    frame = encode_response(response, version=12, correlation_id=0)
    del records
    start = frame.index(b"\xab")
    assert len(frame) - start - 3 == size  # records end before three empty tag sections
    return frame, start


def serve_big_fetches(frame: bytearray, start: int) -> Any:
    def answer(peer: PeerConnection, header: RequestHeader, request: Any) -> bytearray:
        struct.pack_into(">i", frame, 4, header.correlation_id)
        frame[start] = header.correlation_id & 0xFF  # marks which response this was
        return frame

    return kafka_script({FETCH: answer})


def fetch_request() -> FetchRequest:
    partition = FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=2**31 - 1)
    return FetchRequest(
        max_wait_ms=0, min_bytes=1, topics=(FetchTopic(topic="big", partitions=(partition,)),)
    )


def records_of(response: Any) -> memoryview:
    assert isinstance(response, FetchResponse)
    records = response.responses[0].partitions[0].records
    assert isinstance(records, memoryview)
    return records


def test_a_50mb_fetch_response_costs_one_copy(big_fetch_frame: tuple[bytearray, int]) -> None:
    frame, start = big_fetch_frame
    with ScriptedPeer(serve_big_fetches(frame, start)) as peer:
        conn = connection_to(peer, request_timeout=20)
        conn.connect()
        gc.collect()
        tracemalloc.start()
        try:
            began = time.perf_counter()
            response = conn.request(fetch_request())
            elapsed = time.perf_counter() - began
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        records = records_of(response)
        conn.close()
    frame_size = len(frame) - 4
    print(f"50 MB fetch: {elapsed * 1000:.0f} ms, peak {peak / frame_size:.3f}x the frame")
    assert len(records) == FRAME_MB * 1024 * 1024
    assert records[0] == 2  # correlation id 2: the first request after ApiVersions
    # The records are a view of the one buffer the frame was read into, sized exactly.
    assert isinstance(records.obj, bytearray) and len(records.obj) == frame_size
    assert peak < 1.1 * frame_size


def test_borrowed_buffers_are_reused_only_when_released(
    big_fetch_frame: tuple[bytearray, int],
) -> None:
    frame, start = big_fetch_frame
    frame_size = len(frame) - 4
    with ScriptedPeer(serve_big_fetches(frame, start)) as peer:
        conn = connection_to(peer, request_timeout=20)
        conn.connect()
        first = records_of(conn.request(fetch_request(), borrow=True))
        buffer_id = id(first.obj)  # an id, not a reference: a reference would pin it
        marker = first[0]
        del first
        gc.collect()
        tracemalloc.start()
        try:
            second = records_of(conn.request(fetch_request(), borrow=True))
            reuse_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert id(second.obj) == buffer_id, "a released borrowed buffer is reused"
        assert second[0] == marker + 1
        assert reuse_peak < 0.05 * frame_size
        # Still holding `second`: the next borrowed read must not overwrite it.
        third = records_of(conn.request(fetch_request(), borrow=True))
        assert third.obj is not second.obj
        assert second[0] == marker + 1 and third[0] == marker + 2
        # Default (owned) reads never touch the reusable buffer.
        owned = records_of(conn.request(fetch_request()))
        assert owned.obj is not third.obj and len(memoryview(owned.obj)) == frame_size
        conn.close()


# -- SASL ---------------------------------------------------------------------------------


def sasl_peer(server: SaslServer) -> ScriptedPeer:
    handlers = {**server.handlers(), METADATA: reply_with_correlation}
    return ScriptedPeer(kafka_script(handlers))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_authenticates_against_a_scripted_server(mechanism: str) -> None:
    server = SaslServer(username="alice", server_knows="s3cret")
    sasl = SaslConfig(mechanism=mechanism, username="alice", password=Secret("s3cret"))  # type: ignore[arg-type]
    with sasl_peer(server) as peer, connection_to(peer, sasl=sasl) as conn:
        assert server.authenticated and server.mechanism == mechanism
        assert isinstance(conn.request(MetadataRequest(topics=())), MetadataResponse)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_fails_without_leaking_it(
    mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    password = "wrong-password-Zq9"
    server = SaslServer(username="alice", server_knows="s3cret")
    sasl = SaslConfig(mechanism=mechanism, username="alice", password=Secret(password))  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG, logger="ingest")
    with sasl_peer(server) as peer:
        conn = connection_to(peer, sasl=sasl)
        with pytest.raises(BrokerError) as info:
            conn.connect()
    error = info.value
    assert error.name == "SASL_AUTHENTICATION_FAILED" and not error.retriable
    assert f"broker {peer.address} (node 7), SaslAuthenticate v2" in str(error)
    assert not conn.connected
    rendered = "".join(traceback.format_exception(error)) + repr(error) + caplog.text
    rendered += repr(conn) + repr(conn.config)
    assert password not in rendered
    assert "invalid credentials" in str(error)


def test_a_server_that_cannot_prove_it_knows_the_password_is_refused() -> None:
    server = SaslServer(username="alice", server_knows="s3cret", forge_signature=True)
    sasl = SaslConfig(mechanism="SCRAM-SHA-256", username="alice", password=Secret("s3cret"))
    with sasl_peer(server) as peer:
        conn = connection_to(peer, sasl=sasl)
        with pytest.raises(BrokerError, match="server signature does not match"):
            conn.connect()
    assert not conn.connected


def test_a_refused_mechanism_names_the_offered_ones() -> None:
    server = SaslServer(username="alice", server_knows="s", mechanisms=("SCRAM-SHA-512",))
    sasl = SaslConfig(mechanism="PLAIN", username="alice", password=Secret("s"))
    with sasl_peer(server) as peer:
        conn = connection_to(peer, sasl=sasl)
        with pytest.raises(BrokerError) as info:
            conn.connect()
    assert info.value.name == "UNSUPPORTED_SASL_MECHANISM"
    assert "SaslHandshake v1" in str(info.value) and "offers: SCRAM-SHA-512" in str(info.value)


def test_api_versions_request_is_sent_with_our_software_name() -> None:
    seen: list[Any] = []

    def script(peer: PeerConnection) -> None:
        header, request = peer.read_request()
        seen.append(request)
        peer.send_response(ApiVersionsResponse(api_keys=api_versions(SUPPORTED_VERSIONS)), header)
        never_answer(peer)

    with ScriptedPeer(script) as peer:
        connection_to(peer, client_software_version="1.2.3").connect()
    assert seen == [
        ApiVersionsRequest(client_software_name="ingest", client_software_version="1.2.3")
    ]
