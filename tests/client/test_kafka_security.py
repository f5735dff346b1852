"""TLS and SASL against Apache Kafka's own implementation: its SSL listener (a client
certificate required) and its SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, users
created when the storage was formatted). Nothing sits between our client and the broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ingest.client import BrokerConnection, ClientConfig, Cluster, SaslConfig, Secret, TlsConfig
from ingest.errors import BrokerError, KafkaConnectionError
from ingest.protocol.messages import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.testing.tls import make_certificates

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def tls(broker: KafkaCluster, *, client_cert: bool = True, **overrides: Any) -> TlsConfig:
    certs = broker.certificates
    settings: dict[str, Any] = {"ca_file": str(certs.ca_cert)}
    if client_cert:
        settings |= {"cert_file": str(certs.client_cert), "key_file": str(certs.client_key)}
    return TlsConfig(**(settings | overrides))


def config(bootstrap: str, **overrides: Any) -> ClientConfig:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "request_timeout": 10.0,
        "connect_timeout": 5.0,
        "retry_timeout": 0.0,
    }
    return ClientConfig(**(settings | overrides))


def sasl(mechanism: str, user: str = "alice", password: str = "alice-secret") -> SaslConfig:
    return SaslConfig(mechanism=mechanism, username=user, password=Secret(password))  # type: ignore[arg-type]


def first(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def three_records(broker: KafkaCluster, topic: str) -> str:
    create_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, [ProducedRecord(b"v", partition=0) for _ in range(3)])
    return topic


def offsets(cluster: Cluster, topic: str) -> tuple[int, int]:
    tp = Partition(topic, 0)
    earliest = cluster.list_offsets({tp: EARLIEST_TIMESTAMP})[tp].offset
    latest = cluster.list_offsets({tp: LATEST_TIMESTAMP})[tp].offset
    return earliest, latest


@pytest.mark.quick
def test_mutual_tls_on_kafkas_ssl_listener(broker: KafkaCluster, three_records: str) -> None:
    bootstrap = broker.bootstrap_for("SSL")
    with Cluster(config(bootstrap, tls=tls(broker))) as cluster:
        view = cluster.refresh_metadata([three_records])
        (node,) = view.brokers
        # Metadata leads back to the SSL listener, by the certificate's name.
        assert f"{node.host}:{node.port}" == bootstrap
        assert offsets(cluster, three_records) == (0, 3)
        assert cluster.leader_connection(three_records, 0).tls_version in ("TLSv1.2", "TLSv1.3")


def test_kafka_refuses_a_client_without_a_certificate(broker: KafkaCluster) -> None:
    host, port = first(broker.bootstrap_for("SSL"))
    conn = BrokerConnection(
        host, port, config(f"{host}:{port}", tls=tls(broker, client_cert=False))
    )
    with pytest.raises(KafkaConnectionError) as info:
        conn.connect()
    assert f"broker {host}:{port} (bootstrap)" in str(info.value)
    assert not conn.connected


def test_kafkas_certificate_is_checked_against_the_name_we_dialled(broker: KafkaCluster) -> None:
    _, port = first(broker.bootstrap_for("SSL"))
    conn = BrokerConnection("127.0.0.1", port, config(f"127.0.0.1:{port}", tls=tls(broker)))
    with pytest.raises(KafkaConnectionError) as info:
        conn.connect()
    assert "certificate verification failed" in str(info.value) and not info.value.retriable


def test_a_broker_signed_by_another_ca_is_refused(broker: KafkaCluster, tmp_path: Any) -> None:
    other = make_certificates(tmp_path / "other-ca")
    host, port = first(broker.bootstrap_for("SSL"))
    bad = config(f"{host}:{port}", tls=tls(broker, ca_file=str(other.ca_cert)))
    with pytest.raises(KafkaConnectionError, match="certificate verification failed"):
        BrokerConnection(host, port, bad).connect()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_ssl_login_with_each_mechanism(
    broker: KafkaCluster, three_records: str, mechanism: str
) -> None:
    bootstrap = broker.bootstrap_for("SASL_SSL")
    settings = config(bootstrap, tls=tls(broker, client_cert=False), sasl=sasl(mechanism))
    with Cluster(settings) as cluster:
        assert offsets(cluster, three_records) == (0, 3)
        connection = cluster.leader_connection(three_records, 0)
        assert connection.tls_version is not None
        # The client's and the broker's SaslAuthenticate versions met.
        assert connection.negotiation is not None


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("user", ["alice", "mallory"])
def test_a_wrong_password_or_unknown_user_is_refused(
    broker: KafkaCluster, mechanism: str, user: str
) -> None:
    password = "never-logged-7Hq"
    host, port = first(broker.bootstrap_for("SASL_SSL"))
    settings = config(
        f"{host}:{port}", tls=tls(broker, client_cert=False), sasl=sasl(mechanism, user, password)
    )
    conn = BrokerConnection(host, port, settings)
    with pytest.raises(BrokerError) as info:
        conn.connect()
    assert info.value.name == "SASL_AUTHENTICATION_FAILED" and not info.value.retriable
    assert f"broker {host}:{port} (bootstrap), SaslAuthenticate" in str(info.value)
    assert password not in str(info.value)
    assert not conn.connected


@pytest.fixture(scope="module")
def scram_512_only() -> Iterator[KafkaCluster]:
    """A node whose SASL_SSL listener enables SCRAM-SHA-512 alone."""
    with KafkaCluster(
        overrides={"listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    ) as cluster:
        yield cluster


def test_an_unsupported_mechanism_is_answered_with_the_brokers_list(
    scram_512_only: KafkaCluster,
) -> None:
    host, port = first(scram_512_only.bootstrap_for("SASL_SSL"))
    settings = config(
        f"{host}:{port}", tls=tls(scram_512_only, client_cert=False), sasl=sasl("PLAIN")
    )
    conn = BrokerConnection(host, port, settings)
    with pytest.raises(BrokerError) as info:
        conn.connect()
    assert info.value.name == "UNSUPPORTED_SASL_MECHANISM"
    assert "SCRAM-SHA-512" in str(info.value)
    assert not conn.connected
