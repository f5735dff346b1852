"""TLS for real: our client and librdkafka on Apache Kafka's own SSL listener, with a CA made
here (``KafkaCluster.certificates``).

The listener requires a client certificate (mutual TLS) and advertises ``localhost``, the
only name its certificate holds, so Metadata leads the client back through TLS rather than
to the broker's plain listener, and connecting by IP address is a hostname mismatch.
Nothing sits between the client and the broker (the tests once ran behind a socat TLS
terminator in front of Tansu, and skipped where socat was not installed).
"""

from __future__ import annotations

from typing import Any

import pytest

from ingest.client import BrokerConnection, ClientConfig, Cluster, TlsConfig
from ingest.errors import KafkaConnectionError
from ingest.protocol.messages import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.testing.tls import make_certificates


class TlsSetup:
    def __init__(self, broker: KafkaCluster):
        self.broker = broker
        self.certificates = broker.certificates
        host, port = broker.bootstrap_for("SSL").split(",")[0].rsplit(":", 1)
        assert host == "localhost", host
        self.port = int(port)

    def tls(self, **overrides: Any) -> TlsConfig:
        settings: dict[str, Any] = {
            "ca_file": str(self.certificates.ca_cert),
            "cert_file": str(self.certificates.client_cert),
            "key_file": str(self.certificates.client_key),
        }
        settings.update(overrides)
        return TlsConfig(**settings)

    def config(self, host: str = "localhost", **tls_overrides: Any) -> ClientConfig:
        return ClientConfig(
            bootstrap_servers=f"{host}:{self.port}",
            tls=self.tls(**tls_overrides),
            request_timeout=5.0,
            connect_timeout=5.0,
            retry_timeout=0.0,
        )


@pytest.fixture
def tls_setup(broker: KafkaCluster) -> TlsSetup:
    return TlsSetup(broker)


def test_metadata_and_offsets_through_tls(tls_setup: TlsSetup, topic: str) -> None:
    certs = tls_setup.certificates
    create_topic(tls_setup.broker.bootstrap, topic, partitions=1)
    # librdkafka writes the records over the same TLS listener, with the client certificate.
    produce(
        f"localhost:{tls_setup.port}",
        topic,
        [ProducedRecord(b"v", partition=0) for _ in range(3)],
        security_protocol="SSL",
        ssl_ca_location=str(certs.ca_cert),
        ssl_certificate_location=str(certs.client_cert),
        ssl_key_location=str(certs.client_key),
        batch_num_messages=1,
    )
    with Cluster(tls_setup.config()) as cluster:
        view = cluster.refresh_metadata([topic])
        (node,) = view.brokers
        # The advertised address is the TLS listener, never the broker's plain port.
        assert (node.host, node.port) == ("localhost", tls_setup.port)
        assert node.port != tls_setup.broker.port
        tp = Partition(topic, 0)
        earliest = cluster.list_offsets({tp: EARLIEST_TIMESTAMP})[tp].offset
        latest = cluster.list_offsets({tp: LATEST_TIMESTAMP})[tp].offset
        connection = cluster.leader_connection(topic, 0)
        assert connection.tls_version in ("TLSv1.2", "TLSv1.3")
        assert connection.connects == 1  # bootstrap and leader share the one connection
    assert (earliest, latest) == (0, 3)


def test_hostname_checking_is_on_by_default(tls_setup: TlsSetup) -> None:
    assert TlsConfig().check_hostname is True
    config = tls_setup.config(host="127.0.0.1")
    conn = BrokerConnection("127.0.0.1", tls_setup.port, config)
    with pytest.raises(KafkaConnectionError) as info:
        conn.connect()
    assert "certificate verification failed" in str(info.value)
    assert "127.0.0.1" in str(info.value) and not info.value.retriable
    assert not conn.connected


def test_hostname_checking_off_only_when_configured(tls_setup: TlsSetup) -> None:
    config = tls_setup.config(host="127.0.0.1", check_hostname=False)
    with BrokerConnection("127.0.0.1", tls_setup.port, config) as conn:
        assert conn.tls_version is not None and conn.negotiation is not None


def test_an_unknown_ca_is_refused(tls_setup: TlsSetup, tmp_path: Any) -> None:
    other = make_certificates(tmp_path / "other-ca")
    config = tls_setup.config(ca_file=str(other.ca_cert))
    with pytest.raises(KafkaConnectionError, match="certificate verification failed"):
        BrokerConnection("localhost", tls_setup.port, config).connect()


def test_the_listener_requires_our_client_certificate(tls_setup: TlsSetup) -> None:
    config = tls_setup.config(cert_file=None, key_file=None)
    conn = BrokerConnection("localhost", tls_setup.port, config)
    # With TLS 1.3 the refusal arrives after the handshake, as an alert or a plain
    # EOF depending on timing: either way the first request fails, naming the broker.
    with pytest.raises(KafkaConnectionError) as info:
        conn.connect()
    assert f"broker localhost:{tls_setup.port} (bootstrap), ApiVersions v3" in str(info.value)
    assert not conn.connected
