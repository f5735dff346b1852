"""Keys as columns (``[table.key] format``): Avro keys through the real registry, string
keys checked as UTF-8; a key that does not decode is a dead letter, its raw bytes kept.
A tombstone kept as a row has null value columns, nested records too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from ingest.config import load_config
from ingest.engines.local.local_engine import LocalEngine
from ingest.formats.decode import DecodeSpec, decode
from ingest.formats.framed import FramedSpec, decode_framed
from ingest.registry import RegistrySettings
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from tests.registry.test_avro_values import V1, V2, land, order
from tests.runtime.support import write_config

KEY = {
    "type": "record",
    "name": "OrderKey",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "region", "type": "string"}],
}


def test_avro_record_keys_land_as_a_struct_and_bad_keys_as_dead_letters(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    topic = unique_name("avro-keys")
    create_topic(broker.bootstrap, topic, partitions=1)
    client = SchemaRegistryClient(schema_registry.client_conf)
    keys = AvroSerializer(client, json.dumps(KEY))
    values = AvroSerializer(client, json.dumps(V1))
    key_context = SerializationContext(topic, MessageField.KEY)
    value_context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for n in range(200):
        key = None if n == 7 else keys({"id": n, "region": f"r{n % 3}"}, key_context)
        producer.produce(topic, values(order(n), value_context), key, 0)
    producer.produce(topic, values(order(200), value_context), b"\x01not framed", 0)
    # A tombstone kept as a row: its nested record column (address) is a null struct.
    producer.produce(topic, None, keys({"id": 201, "region": "r0"}, key_context), 0)
    assert producer.flush(30) == 0
    registry = {"urls": [schema_registry.url]}
    cfg = land(broker, tmp_path, topic, {"format": "avro"}, registry, key={"format": "avro"})
    verdict = verify_exact(
        broker.bootstrap, topic, cfg.source.group_id, cfg.table.uri,
        dead_letter_uri=cfg.dead_letter_uri(),
    )  # fmt: skip
    verdict.raise_if_not_exact()
    assert verdict.dead_letters == 1
    table = DeltaTable(cfg.table.uri).to_pyarrow_table().sort_by("offset")
    assert table.schema.field("key").type == pa.struct(
        [("id", pa.int64()), ("region", pa.string())]
    )
    rows = table.select(["key", "id"]).to_pylist()
    assert rows[0] == {"key": {"id": 0, "region": "r0"}, "id": 0}
    assert rows[7]["key"] is None  # a null key
    assert rows[199] == {"key": {"id": 199, "region": "r1"}, "id": 199}
    tombstone = table.slice(200, 1).to_pylist()[0]
    assert tombstone["key"] == {"id": 201, "region": "r0"}
    assert tombstone["id"] is None and tombstone["address"] is None
    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    assert dead[0]["key"] == b"\x01not framed"  # the raw key kept
    assert "key: not Confluent-framed (Avro): magic byte 1" in dead[0]["error_message"]


def test_a_primitive_avro_key_is_the_key_column_itself(schema_registry: SchemaRegistry) -> None:
    client = SchemaRegistryClient(schema_registry.client_conf)
    settings = RegistrySettings((schema_registry.url,))
    for schema, samples, arrow in (
        ('"string"', ["a", "ß", ""], pa.string()),
        ('"long"', [0, -5, 2**40], pa.int64()),
    ):
        context = SerializationContext(unique_name("avro-key-unit"), MessageField.KEY)
        serializer = AvroSerializer(client, schema)
        payloads = pa.array([serializer(v, context) for v in samples], pa.binary())
        spec = FramedSpec("avro", settings, pa.schema([pa.field("key", arrow)]), wrap="key")
        columns, good, errors = decode_framed(payloads, spec)
        assert errors == [] and good.tolist() == [0, 1, 2]
        assert columns.column("key").type == arrow
        assert columns.column("key").to_pylist() == samples


def test_string_keys_must_be_utf8() -> None:
    records = pa.table(
        {
            "topic": pa.array(["t"] * 3),
            "partition": pa.array([0] * 3, pa.int32()),
            "offset": pa.array([0, 1, 2], pa.int64()),
            "timestamp": pa.array([0] * 3, pa.timestamp("us", tz="UTC")),
            "timestamp_type": pa.array([0] * 3, pa.int8()),
            "key": pa.array([b"ok", b"\xff\xfe", None], pa.binary()),
            "value": pa.array([b"v"] * 3, pa.binary()),
            "headers": pa.array([[]] * 3, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        }
    )  # fmt: skip
    decoded = decode(records, DecodeSpec(key_format="string"))
    assert decoded.rows.schema.field("key").type == pa.string()
    assert decoded.rows.column("key").to_pylist() == ["ok", None]
    assert decoded.rows.column("offset").to_pylist() == [0, 2]
    assert decoded.dead.column("offset").to_pylist() == [1]
    assert decoded.dead.column("key").to_pylist() == [b"\xff\xfe"]
    assert str(decoded.dead.column("error_message")[0]).startswith("key: ")


@pytest.mark.spark
def test_on_spark_avro_keys_and_values_decode_in_the_tasks_and_a_transform_sees_them(
    broker: KafkaCluster, schema_registry: SchemaRegistry, spark: Any, tmp_path: Path
) -> None:
    """spark.engine = "spark": the tasks decode on Spark's Python workers. A transform's
    view has the decoded key and value columns; a writer's new field cannot widen a
    transform's fixed columns, so its records are dead letters saying so."""
    topic = unique_name("avro-spark")
    create_topic(broker.bootstrap, topic, partitions=1)
    client = SchemaRegistryClient(schema_registry.client_conf)
    keys = AvroSerializer(client, json.dumps(KEY))
    v1 = AvroSerializer(client, json.dumps(V1))
    v2 = AvroSerializer(
        client, json.dumps(V2), conf={"subject.name.strategy": record_subject_name_strategy}
    )
    key_context = SerializationContext(topic, MessageField.KEY)
    value_context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for n in range(120):
        value = (
            v2(order(n, coupon=True), value_context) if n >= 100 else v1(order(n), value_context)
        )
        producer.produce(topic, value, keys({"id": n, "region": f"r{n % 3}"}, key_context), 0)
    assert producer.flush(30) == 0
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g"),
        table=tmp_path / "table",
        sections={
            "table": {
                "value": {"format": "avro"},
                "key": {"format": "avro"},
                "transform": "SELECT offset, key.region AS region, id, amount FROM batch",
            },
            "schema_registry": {"urls": [schema_registry.url]},
            "spark": {"engine": "spark"},
        },
    )
    cfg = load_config(path)
    # The test session's Spark: a session of its own would stop the shared one at its end.
    outcome = group_run(cfg, until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message
    table = DeltaTable(cfg.table.uri).to_pyarrow_table().sort_by("offset")
    assert table.column_names == ["offset", "region", "id", "amount"]
    assert table.num_rows == 100  # V1's; V2's add a field the transform cannot take
    assert table.slice(4, 1).to_pylist()[0]["region"] == "r1"
    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    assert len(dead) == 20
    assert all(
        "new fields coupon (the transform's columns are fixed)" in d["error_message"] for d in dead
    )
    # Without a transform, Spark runs the files tasks (the arrow path): V2's field is a
    # new column, in the commit of its rows.
    path = write_config(
        tmp_path / "arrow.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g"),
        table=tmp_path / "arrow",
        sections={
            "table": {"value": {"format": "avro"}, "key": {"format": "avro"}},
            "schema_registry": {"urls": [schema_registry.url]},
            "spark": {"engine": "spark"},
        },
    )
    cfg = load_config(path)
    engine = group_run(cfg, until_end=True, spark=spark)
    assert not isinstance(engine.lander, LocalEngine)  # Spark's own tasks
    outcome = engine.run()
    assert outcome.exit_code == 0, outcome.message
    table = DeltaTable(cfg.table.uri).to_pyarrow_table().sort_by("offset")
    assert table.num_rows == 120
    assert table.column("coupon").to_pylist() == [None] * 100 + [f"C{n}" for n in range(100, 120)]
    assert table.schema.field("key").type == pa.struct(
        [("id", pa.int64()), ("region", pa.string())]
    )


def test_a_protobuf_key_is_a_struct_of_its_message(schema_registry: SchemaRegistry) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import descriptor_pb2

    from tests.registry.protobuf_support import CONF, F, add_field, classes

    proto = descriptor_pb2.FileDescriptorProto(
        name="keys/order_key.proto", package="keys", syntax="proto3"
    )
    message = proto.message_type.add(name="OrderKey")
    add_field(message, "id", 1, F.TYPE_INT64)
    add_field(message, "region", 2, F.TYPE_STRING)
    cls = classes(proto)["keys.OrderKey"]
    client = SchemaRegistryClient(schema_registry.client_conf)
    context = SerializationContext(unique_name("proto-key"), MessageField.KEY)
    serializer = ProtobufSerializer(cls, client, CONF)
    payloads = pa.array(
        [serializer(cls(id=n, region=f"r{n}"), context) for n in range(3)] + [None], pa.binary()
    )
    kind = pa.struct([("id", pa.int64()), ("region", pa.string())])
    spec = FramedSpec(
        "protobuf",
        RegistrySettings((schema_registry.url,)),
        pa.schema([pa.field("key", kind)]),
        wrap="key",
    )
    columns, good, errors = decode_framed(payloads, spec)
    assert errors == [] and good.tolist() == [0, 1, 2, 3]
    assert columns.column("key").to_pylist() == [
        {"id": 0, "region": "r0"},
        {"id": 1, "region": "r1"},
        {"id": 2, "region": "r2"},
        None,
    ]
