"""The schema registry harness: Apicurio Registry resolved from Maven Central once, started
on a Java 21+ and ready only when Confluent's API answers; confluent-kafka's own serializers
round-trip Avro, JSON Schema and Protobuf values through it, an incompatible version is
refused, an unknown id is 40403, and the Apicurio deviations the module names hold."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import urllib.request
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import ingest.testing.registry as registry
from ingest.errors import DependencyError
from ingest.jars import resolve
from ingest.testing import SchemaRegistry
from ingest.testing.registry import (
    APICURIO_ARTIFACT,
    APICURIO_VERSION,
    MIN_JAVA,
    apicurio_home,
    java_version,
    registry_java,
)

ORDER_FIELDS = [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}]


def _order(*extra: dict[str, Any]) -> str:
    """An Avro record schema: the two order fields, then ``extra``."""
    fields = [*ORDER_FIELDS, *extra]
    return json.dumps({"type": "record", "name": "Order", "namespace": "demo", "fields": fields})


def _client(server: SchemaRegistry) -> SchemaRegistryClient:
    return SchemaRegistryClient(server.client_conf)


def _framed_id(blob: bytes) -> int:
    """The schema id of Confluent's framing: magic byte 0, then the id as a big-endian int32."""
    assert blob[0] == 0
    return int(struct.unpack(">i", blob[1:5])[0])


def test_the_distribution_is_the_pinned_release_and_a_warm_start_resolves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (archive,) = resolve([APICURIO_ARTIFACT])
    assert archive.name == f"apicurio-registry-app-{APICURIO_VERSION}-all.tar.gz"
    home = apicurio_home()
    assert (home / "quarkus-run.jar").is_file()

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a warm start started a process: {args[:1]}")

    import ingest.jars

    monkeypatch.setattr(ingest.jars.subprocess, "run", no_process)
    assert apicurio_home() == home
    assert resolve([APICURIO_ARTIFACT]) == [archive]


def test_the_java_is_21_or_newer_and_without_one_the_reason_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    java = registry_java()
    assert (java_version(java) or 0) >= MIN_JAVA
    not_java = tmp_path / "java"
    not_java.write_text("")
    monkeypatch.setattr(registry, "_candidates", lambda: [not_java])
    with pytest.raises(
        DependencyError, match=rf"needs Java {MIN_JAVA}\+.*{not_java} \(not a Java\)"
    ):
        registry_java()


def test_ready_means_confluents_api_answers_with_backward_compatibility(
    schema_registry: SchemaRegistry,
) -> None:
    assert schema_registry.url.startswith("http://127.0.0.1:")
    assert schema_registry.url.endswith("/apis/ccompat/v7")
    with urllib.request.urlopen(f"{schema_registry.url}/config", timeout=5) as answer:
        assert json.load(answer) == {"compatibilityLevel": "BACKWARD"}


def test_avro_round_trips_through_confluents_serializers(
    schema_registry: SchemaRegistry, topic: str
) -> None:
    client = _client(schema_registry)
    context = SerializationContext(topic, MessageField.VALUE)
    blob = AvroSerializer(client, _order())({"id": "o-1", "amount": 42}, context)
    assert blob is not None
    registered = client.get_latest_version(f"{topic}-value")
    assert _framed_id(blob) == registered.schema_id
    assert AvroDeserializer(client)(blob, context) == {"id": "o-1", "amount": 42}
    # The payload after the framing is plain Avro binary: fastavro reads it alone.
    writer = fastavro.parse_schema(json.loads(client.get_schema(_framed_id(blob)).schema_str))
    assert fastavro.schemaless_reader(io.BytesIO(blob[5:]), writer) == {"id": "o-1", "amount": 42}


def test_an_incompatible_version_is_refused_and_a_compatible_one_read_old_data(
    schema_registry: SchemaRegistry, topic: str
) -> None:
    client = _client(schema_registry)
    subject = f"{topic}-value"
    context = SerializationContext(topic, MessageField.VALUE)
    blob = AvroSerializer(client, _order())({"id": "o-1", "amount": 42}, context)
    assert blob is not None
    # A new required field without a default cannot read the old data: BACKWARD refuses it.
    required = Schema(_order({"name": "note", "type": "string"}), "AVRO")
    assert client.test_compatibility(subject, required) is False
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, required)
    assert refused.value.http_status_code == 409
    assert client.get_versions(subject) == [1]
    with_default = _order({"name": "note", "type": "string", "default": ""})
    assert client.register_schema(subject, Schema(with_default, "AVRO")) != _framed_id(blob)
    assert client.get_versions(subject) == [1, 2]
    read = AvroDeserializer(client, with_default)(blob, context)
    assert read == {"id": "o-1", "amount": 42, "note": ""}


def test_an_unknown_id_answers_40403(schema_registry: SchemaRegistry) -> None:
    with pytest.raises(SchemaRegistryError) as unknown:
        _client(schema_registry).get_schema(2_000_000_000)
    assert (unknown.value.http_status_code, unknown.value.error_code) == (404, 40403)


def test_ids_are_content_ids_one_text_under_two_subjects_is_one_id(
    schema_registry: SchemaRegistry, topic: str
) -> None:
    client = _client(schema_registry)
    first = client.register_schema(f"{topic}-a-value", Schema(_order(), "AVRO"))
    second = client.register_schema(f"{topic}-b-value", Schema(_order(), "AVRO"))
    assert first == second


def test_json_schema_round_trips_through_confluents_serializers(
    schema_registry: SchemaRegistry, topic: str
) -> None:
    client = _client(schema_registry)
    schema = json.dumps(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Order",
            "type": "object",
            "properties": {"id": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["id"],
        }
    )
    context = SerializationContext(topic, MessageField.VALUE)
    blob = JSONSerializer(schema, client)({"id": "o-2", "amount": 7}, context)
    assert blob is not None
    assert _framed_id(blob) == client.get_latest_version(f"{topic}-value").schema_id
    assert json.loads(blob[5:]) == {"id": "o-2", "amount": 7}
    decoded = JSONDeserializer(None, schema_registry_client=client)(blob, context)
    assert decoded == {"id": "o-2", "amount": 7}


def _order_message(package: str) -> Any:
    """A Protobuf message class built at run time from a FileDescriptorProto (no protoc)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"{package}/order.proto", package=package, syntax="proto3"
    )
    message = proto.message_type.add(name="Order")
    field = descriptor_pb2.FieldDescriptorProto
    message.field.add(name="id", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    message.field.add(name="amount", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))


def test_protobuf_round_trips_and_comes_back_as_a_file_descriptor(
    schema_registry: SchemaRegistry, topic: str
) -> None:
    client = _client(schema_registry)
    order = _order_message("demo")
    context = SerializationContext(topic, MessageField.VALUE)
    conf = {"use.deprecated.format": False}
    blob = ProtobufSerializer(order, client, conf)(order(id="o-3", amount=9), context)
    assert blob is not None
    schema_id = _framed_id(blob)
    decoded = ProtobufDeserializer(order, conf)(blob, context)
    assert (decoded.id, decoded.amount) == ("o-3", 9)
    # Apicurio's deviation: /schemas/ids/{id} gives the schema as a base64 FileDescriptorProto.
    stored = client.get_schema(schema_id)
    assert stored.schema_type == "PROTOBUF"
    descriptor = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(stored.schema_str))
    assert [m.name for m in descriptor.message_type] == ["Order"]
    assert [f.name for f in descriptor.message_type[0].field] == ["id", "amount"]


def test_an_instance_starts_and_stops_by_pid_leaving_no_process(tmp_path: Path) -> None:
    server = SchemaRegistry(work_dir=tmp_path / "registry").start()
    pid = server.pid
    assert pid is not None and server.running()
    assert server.process.popen is not None and server.process.popen.args[0] == server.java
    with urllib.request.urlopen(f"{server.url}/subjects", timeout=5) as answer:
        assert json.load(answer) == []
    assert server.stop() in (0, 143)  # the JVM's exit on SIGTERM is 143
    assert not server.running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert server.log_path.is_file()
