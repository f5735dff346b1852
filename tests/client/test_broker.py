"""The client against the real test broker, Apache Kafka (SASL and TLS against Kafka are in
test_kafka_security.py).

Tansu 0.6.0 is kept for its SASL deviations (docs/kafka-compat.md): its memory:// and s3://
engines do not store SCRAM credentials, so a login can only be refused, and its SASL server
offers no PLAIN and hangs up instead of answering UNSUPPORTED_SASL_MECHANISM.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ingest.client import BrokerConnection, ClientConfig, Cluster, SaslConfig, Secret
from ingest.client.offset_lookup import READ_COMMITTED
from ingest.errors import BrokerError, KafkaConnectionError
from ingest.protocol.codec import API_NAMES, SUPPORTED_VERSIONS
from ingest.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ApiVersionsRequest,
    ApiVersionsResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
)
from ingest.protocol.partition import Partition
from ingest.protocol.primitives import ZERO_UUID
from ingest.protocol.recordbatch.records import decode_records
from ingest.testing import (
    KafkaCluster,
    ProducedRecord,
    TansuBroker,
    create_topic,
    produce,
    read_topic,
)
from tests.brokers import on_tansu

log = logging.getLogger("ingest.test")


def make_config(bootstrap: str, **overrides: Any) -> ClientConfig:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "request_timeout": 10.0,
        "retry_timeout": 10.0,
        "reconnect_backoff": 0.02,
        "reconnect_backoff_max": 0.5,
    }
    settings.update(overrides)
    return ClientConfig(**settings)


# APIs a broker may leave out (the client then does without them). Tansu 0.6.0 does not
# offer OffsetForLeaderEpoch, nor ConsumerGroupHeartbeat (KIP-848; it offers
# ConsumerGroupDescribe v0 only), see docs/kafka-compat.md; Apache Kafka offers every API
# we speak.
NOT_ON_TANSU = frozenset({"OffsetForLeaderEpoch", "ConsumerGroupHeartbeat"})


def test_negotiation_table(any_broker: KafkaCluster, request: pytest.FixtureRequest) -> None:
    broker = any_broker
    with BrokerConnection(broker.host, broker.port, make_config(broker.bootstrap)) as conn:
        negotiation = conn.negotiation
    assert negotiation is not None
    table = negotiation.table()
    print(f"\nnegotiated with {broker!r}:\n{table}")
    log.info("negotiated with %r:\n%s", broker, table)
    assert negotiation.api_versions_version == 3
    assert [api.api_key for api in negotiation.apis] == sorted(SUPPORTED_VERSIONS)
    absent = NOT_ON_TANSU if on_tansu(request) else frozenset()
    for api in negotiation.apis:
        assert api.name in table
        if api.name in absent:
            assert api.broker is None and api.chosen is None, api
            continue
        assert api.broker is not None, f"the broker should offer {api.name}"
        assert api.chosen == min(api.ours[1], api.broker[1]), api
    chosen = {api.name: api.chosen for api in negotiation.apis}
    # Kafka 4.4 and Tansu 0.6.0 both offer at least our ranges (the printed table shows
    # each broker's).
    assert chosen["Metadata"] == 12 and chosen["Fetch"] == SUPPORTED_VERSIONS[1][1]
    assert chosen["ApiVersions"] == 3 and chosen["FindCoordinator"] == 4
    assert set(chosen) == set(API_NAMES.values())


def test_metadata_of_a_16_partition_topic(broker: KafkaCluster, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    create_topic(broker.bootstrap, topic, partitions=16)
    with Cluster(make_config(broker.bootstrap)) as cluster:
        view = cluster.refresh_metadata([topic])
        again = cluster.refresh_metadata([topic])
    info = view.topic(topic)
    assert info is not None and info.error_code == 0
    assert [p.partition for p in info.partitions] == list(range(16))
    assert info.topic_id != ZERO_UUID and not info.is_internal
    assert again.topic(topic) == info  # stable across refreshes, topic id included
    (node,) = view.brokers
    assert (node.host, node.port) == (broker.host, broker.port)
    # librdkafka's view of the same topic is the reference.
    reference = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(topic, timeout=10)
    assert set(reference.brokers) == {node.node_id}
    for p in info.partitions:
        expected = reference.topics[topic].partitions[p.partition]
        assert (p.leader_id, p.replicas, p.isr) == (
            expected.leader,
            tuple(expected.replicas),
            tuple(expected.isrs),
        )
        assert p.error_code == 0


def test_pipelined_requests_against_the_broker(broker: KafkaCluster, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    requests = [
        MetadataRequest(topics=(MetadataRequestTopic(name=topic),)),
        ApiVersionsRequest(client_software_name="ingest", client_software_version="0"),
        ListOffsetsRequest(
            isolation_level=READ_COMMITTED,
            topics=(
                ListOffsetsTopic(
                    name=topic,
                    partitions=(ListOffsetsPartition(partition_index=1, timestamp=-2),),
                ),
            ),
        ),
        FindCoordinatorRequest(coordinator_keys=("pipelined-group",)),
        MetadataRequest(topics=()),
        ApiVersionsRequest(client_software_name="ingest", client_software_version="0"),
    ]
    expected = [
        MetadataResponse,
        ApiVersionsResponse,
        ListOffsetsResponse,
        FindCoordinatorResponse,
        MetadataResponse,
        ApiVersionsResponse,
    ]
    with BrokerConnection(broker.host, broker.port, make_config(broker.bootstrap)) as conn:
        tickets = [conn.send(request) for request in requests]
        assert conn.in_flight == len(requests)
        # Read the newest first: the older answers arrive (in order) and wait for us.
        responses = {t.correlation_id: conn.receive(t) for t in reversed(tickets)}
        assert conn.in_flight == 0 and conn.connected
    for ticket, response_type in zip(tickets, expected, strict=True):
        assert type(responses[ticket.correlation_id]) is response_type
    listed = responses[tickets[2].correlation_id]
    assert isinstance(listed, ListOffsetsResponse)
    assert listed.topics[0].name == topic and listed.topics[0].partitions[0].partition_index == 1


def test_list_offsets_and_fetch_agree_with_the_reference_reader(
    broker: KafkaCluster, topic: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=3)
    records = [
        ProducedRecord(f"value-{i}".encode(), key=f"key-{i}".encode(), partition=i % 3)
        for i in range(30)
    ]
    # Batched as librdkafka likes: Kafka answers LATEST with the high watermark. (Tansu
    # answers the newest batch's base offset + 1; docs/kafka-compat.md.)
    produce(broker.bootstrap, topic, records)
    reference = read_topic(broker.bootstrap, topic)
    by_partition = {p: [r for r in reference if r.partition == p] for p in range(3)}
    partitions = [Partition(topic, p) for p in range(3)]
    with Cluster(make_config(broker.bootstrap)) as cluster:
        earliest = cluster.list_offsets({tp: EARLIEST_TIMESTAMP for tp in partitions})
        latest = cluster.list_offsets({tp: LATEST_TIMESTAMP for tp in partitions})
        for tp in partitions:
            expected = by_partition[tp.partition]
            assert earliest[tp].offset == expected[0].offset
            assert latest[tp].offset == expected[-1].offset + 1
            conn = cluster.leader_connection(tp.topic, tp.partition)
            fetch = FetchRequest(
                max_wait_ms=100,
                min_bytes=1,
                isolation_level=READ_COMMITTED,
                topics=(
                    FetchTopic(
                        topic=topic,
                        partitions=(
                            FetchPartition(
                                partition=tp.partition, fetch_offset=0, partition_max_bytes=1 << 20
                            ),
                        ),
                    ),
                ),
            )
            response = conn.request(fetch, borrow=True)
            assert isinstance(response, FetchResponse)
            data = response.responses[0].partitions[0]
            assert data.error_code == 0
            assert data.high_watermark == expected[-1].offset + 1
            assert data.records is not None
            decoded = decode_records(data.records, topic=topic, partition=tp.partition)
            got = decoded.batch.to_pydict()
            assert got["offset"] == [r.offset for r in expected]
            assert got["key"] == [r.key for r in expected]
            assert got["value"] == [r.value for r in expected]
            del response, data, decoded


def test_find_coordinator_on_the_broker(broker: KafkaCluster, group: str) -> None:
    with Cluster(make_config(broker.bootstrap)) as cluster:
        cluster.bootstrap()
        coordinators = cluster.find_coordinators([group, f"{group}-2"])
        (node,) = cluster.brokers.values()
    assert set(coordinators) == {group, f"{group}-2"}
    for found in coordinators.values():
        assert (found.node_id, found.host, found.port) == (node.node_id, broker.host, broker.port)


def test_the_leader_cache_survives_a_broker_restart(
    restartable_broker: KafkaCluster, topic: str
) -> None:
    durable = restartable_broker
    create_topic(durable.bootstrap, topic, partitions=4)
    produce(
        durable.bootstrap,
        topic,
        [ProducedRecord(b"x", partition=p) for p in range(4)],
    )
    partitions = [Partition(topic, p) for p in range(4)]
    with Cluster(make_config(durable.bootstrap, retry_timeout=30)) as cluster:
        before = cluster.list_offsets({tp: EARLIEST_TIMESTAMP for tp in partitions})
        cached = cluster.topic(topic)
        connection = cluster.leader_connection(topic, 0)
        assert connection.connects == 1
        durable.restart(kill=True)
        # The open connection is dead now; the client notices, reconnects with
        # backoff, refreshes the leaders and answers as before.
        after = cluster.list_offsets({tp: EARLIEST_TIMESTAMP for tp in partitions})
        assert cluster.leader_connection(topic, 0) is connection
        assert connection.connects == 2
        refreshed = cluster.topic(topic)
    assert {tp: o.offset for tp, o in after.items()} == {tp: o.offset for tp, o in before.items()}
    assert cached is not None and refreshed is not None
    assert refreshed is not cached, "losing the connection must refresh the leader cache"
    assert refreshed.topic_id == cached.topic_id
    assert [p.leader_id for p in refreshed.partitions] == [p.leader_id for p in cached.partitions]


class AuthenticatingBroker(TansuBroker):
    """Tansu with ``--authentication``: every connection must log in with SASL."""

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--authentication"]


@pytest.fixture(scope="module")
def auth_broker() -> Any:
    server = AuthenticatingBroker().start()
    yield server
    server.kill()
    server.cleanup()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_with_tansu(auth_broker: TansuBroker, mechanism: str) -> None:
    password = "never-logged-7Hq"
    sasl = SaslConfig(mechanism=mechanism, username="nobody", password=Secret(password))  # type: ignore[arg-type]
    conn = BrokerConnection(
        auth_broker.host, auth_broker.port, make_config(auth_broker.bootstrap, sasl=sasl)
    )
    with pytest.raises(BrokerError) as info:
        conn.connect()
    message = str(info.value)
    # The broker took our first message, sent its salt and nonce, checked our
    # proof and refused the unknown user in its final message (RFC 5802 "e=").
    assert info.value.name == "SASL_AUTHENTICATION_FAILED" and not info.value.retriable
    assert f"broker {auth_broker.bootstrap} (bootstrap), SaslAuthenticate v2" in message
    assert "unknown-user" in message and password not in message
    assert not conn.connected


@pytest.mark.xfail(
    strict=True,
    raises=KafkaConnectionError,
    reason="Tansu 0.6.0 offers no PLAIN and closes the connection instead of answering "
    "UNSUPPORTED_SASL_MECHANISM with its mechanisms (on Kafka: test_kafka_security.py)",
)
def test_an_unsupported_mechanism_is_answered_not_hung_up_on_tansu(
    auth_broker: TansuBroker,
) -> None:
    sasl = SaslConfig(mechanism="PLAIN", username="nobody", password=Secret("pw"))
    conn = BrokerConnection(
        auth_broker.host, auth_broker.port, make_config(auth_broker.bootstrap, sasl=sasl)
    )
    with pytest.raises(BrokerError) as info:
        conn.connect()
    assert info.value.name == "UNSUPPORTED_SASL_MECHANISM"
