"""The Apache Kafka harness: resolved from Maven Central once, formatted and started in KRaft
combined mode, ready only when it answers ApiVersions, stopped, killed, paused and restarted
by PID on the same ports and data; and a 3-node cluster that keeps serving with a node gone."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

from ingest.errors import DependencyError
from ingest.jars import Artifact, _ivy_module, resolve
from ingest.testing import (
    KAFKA_VERSION,
    KafkaCluster,
    ProducedRecord,
    api_versions_answered,
    create_topic,
    message_definition,
    produce,
    read_topic,
)
from ingest.testing.apache_kafka import KAFKA_ARTIFACTS, kafka_classpath, wait_for_leaders


def test_the_classpath_is_the_pinned_release_and_resolves_warm_without_a_jvm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jars = {jar.name for jar in kafka_classpath()}
    assert f"kafka_2.13-{KAFKA_VERSION}.jar" in jars
    assert f"kafka-clients-{KAFKA_VERSION}.jar" in jars
    assert any(name.startswith("log4j-core-") for name in jars)
    assert any(name.startswith("log4j-slf4j-impl-") for name in jars)

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a warm resolution started a process: {args[:1]}")

    # A warm resolution reads the cached classpath file: no JVM (Ivy), no process at all.
    import ingest.jars

    monkeypatch.setattr(ingest.jars.subprocess, "run", no_process)
    monkeypatch.setattr(ingest.jars.subprocess, "Popen", no_process)
    again = resolve(KAFKA_ARTIFACTS)
    assert {jar.name for jar in again} == jars


def test_a_plain_coordinate_spells_and_resolves_as_before() -> None:
    # The cache key is the coordinates' spelling: a plain one must not change it.
    for text in KAFKA_ARTIFACTS:
        artifact = Artifact.parse(text)
        assert str(artifact) == text and artifact.plain
    module = _ivy_module([Artifact.parse("org.example:lib:1.0")])
    assert module.splitlines()[0] == '<ivy-module version="2.0">'
    assert '<dependency org="org.example" name="lib" rev="1.0" conf="default->default"/>' in module


@pytest.mark.parametrize(
    ("text", "classifier", "ext"),
    [
        ("io.apicurio:apicurio-registry-app:3.3.3:all@tar.gz", "all", "tar.gz"),
        ("org.example:lib:1.0:sources", "sources", None),
        ("org.example:dist:1.0@zip", None, "zip"),
    ],
)
def test_a_classifier_and_an_extension_name_one_file_resolved_alone(
    text: str, classifier: str | None, ext: str | None
) -> None:
    artifact = Artifact.parse(text)
    assert (artifact.classifier, artifact.ext, str(artifact)) == (classifier, ext, text)
    assert not artifact.plain
    ivy = "{http://ant.apache.org/ivy/maven}"
    root = ET.fromstring(_ivy_module([artifact, Artifact.parse("org.example:lib:1.0")]))
    dependencies = root.find("dependencies")
    assert dependencies is not None
    named, plain = dependencies
    assert named.get("transitive") == "false"  # its POM's dependencies are not wanted
    assert named.get("conf") == "default->default"
    (file,) = named
    assert file.get("name") == artifact.name
    assert file.get("type") == file.get("ext") == (ext or "jar")
    assert file.get(f"{ivy}classifier") == classifier
    assert plain.get("transitive") is None and len(plain) == 0


@pytest.mark.parametrize("text", ["a:b", "a:b:1:c:d", "a::1", "a:b:1@", "a:b:1:@zip", "a:b:1:c@"])
def test_a_malformed_coordinate_is_refused(text: str) -> None:
    with pytest.raises(DependencyError, match="not a Maven coordinate"):
        Artifact.parse(text)


def test_message_definitions_come_from_the_pinned_kafka_clients_jar() -> None:
    fetch = json.loads(
        "\n".join(
            line
            for line in message_definition("FetchRequest").splitlines()
            if not line.strip().startswith("//")
        )
    )
    assert fetch["apiKey"] == 1 and fetch["type"] == "request"
    assert "CurrentLeaderEpoch" in message_definition("FetchRequest")


def test_ready_means_api_versions_answered_and_the_log_says_started(
    broker: KafkaCluster,
) -> None:
    assert api_versions_answered(broker.host, broker.port)
    # The whole log: the session's broker may have logged far more than a tail since.
    assert "Kafka Server started" in broker.log_path.read_text(errors="replace")


@pytest.fixture
def own_node() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster().start()
    yield cluster
    cluster.cleanup()
    assert not cluster.running()
    assert not cluster.work_dir.exists()


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_a_node_restarts_on_the_same_ports_and_data(
    own_node: KafkaCluster, topic: str, kill: bool
) -> None:
    create_topic(own_node.bootstrap, topic, partitions=2)
    sent = [ProducedRecord(f"v{i}".encode(), partition=i % 2) for i in range(500)]
    produce(own_node.bootstrap, topic, sent, acks="all")
    before = read_topic(own_node.bootstrap, topic)
    pid, ports = own_node.pid, dict(own_node.nodes[0].ports)

    own_node.restart(kill=kill)

    assert own_node.pid != pid and own_node.nodes[0].ports == ports
    assert read_topic(own_node.bootstrap, topic) == before
    assert len(before) == 500


@pytest.mark.slow
def test_a_paused_node_stops_answering_and_resumes(own_node: KafkaCluster) -> None:
    own_node.pause()
    try:
        with pytest.raises((TimeoutError, socket.timeout)):
            api_versions_answered(own_node.host, own_node.port, timeout=0.5)
    finally:
        own_node.resume()
    assert api_versions_answered(own_node.host, own_node.port, timeout=10)


@pytest.mark.slow
def test_three_nodes_replicate_and_serve_with_one_node_down(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    assert len(kafka_cluster.bootstrap.split(",")) == 3
    create_topic(kafka_cluster.bootstrap, topic, partitions=3, replication_factor=3)
    wait_for_leaders(kafka_cluster.bootstrap, topic)
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    resource = ConfigResource("topic", topic)
    described = admin.describe_configs([resource])[resource].result(timeout=10)
    assert described["min.insync.replicas"].value == "2"

    victim = kafka_cluster.nodes[2]
    victim.kill()
    try:
        # acks=all needs 2 in-sync replicas of 3: one node gone, writes still succeed.
        sent = [ProducedRecord(f"v{i}".encode(), partition=i % 3) for i in range(300)]
        assert produce(kafka_cluster.bootstrap, topic, sent, acks="all") == 300
        assert len(read_topic(kafka_cluster.bootstrap, topic)) == 300
    finally:
        victim.start()
    wait_for_leaders(kafka_cluster.bootstrap, topic, timeout=60)


def test_cluster_ids_never_start_with_a_dash() -> None:
    # StorageTool's parser takes "-t -abc..." for an option: one random id in 64 would fail
    # to format. 2,000 draws miss such an id with probability (63/64)**2000, about 2e-14.
    from ingest.testing.apache_kafka import _random_cluster_id

    ids = [_random_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
