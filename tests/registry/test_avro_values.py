"""Avro values end to end: produced by confluent-kafka's AvroSerializer through a real
registry (Apicurio), landed by ``ingest run --until-end`` on Apache Kafka, read back.

The columns follow Spark's ``from_avro``; a second, compatible writer's schema lands
beside the first; a value without the magic byte, a truncated one and one naming a
schema id the registry does not know become dead letters with the reason; every offset
ends in one table, once.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from ingest.config import IngestConfig, load_config
from ingest.engines.local.local_engine import LocalEngine
from ingest.errors import ConfigError
from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from tests.runtime.support import group_offsets, write_config

PARTITIONS = 2

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SENT"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}],
            },
        },
    ],
}  # fmt: skip
# Compatible (BACKWARD): one optional field more.
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}],
}
# The table's columns, V2's in Spark DDL (a V1 record has no coupon: null).
DDL = (
    "id BIGINT, customer STRING, amount DECIMAL(10,2), placed TIMESTAMP, day DATE, "
    "status STRING, tags ARRAY<STRING>, note STRING, "
    "address STRUCT<city: STRING, zip: INT>, coupon STRING"
)


def order(n: int, *, coupon: bool = False) -> dict[str, Any]:
    value: dict[str, Any] = {
        "id": n,
        "customer": f"c{n % 7}",
        "amount": decimal.Decimal(n % 1000) / 100 - 3,  # negative ones too
        "placed": dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=n),
        "day": dt.date(2026, 11, 1) + dt.timedelta(days=n % 30),
        "status": ["NEW", "PAID", "SENT"][n % 3],
        "tags": [f"t{i}" for i in range(n % 4)],
        "note": None if n % 2 else f"note {n}",
        "address": {"city": f"city{n % 5}", "zip": 10_000 + n % 90_000},
    }
    if coupon:
        value["coupon"] = f"C{n}"
    return value


def produce(bootstrap: str, topic: str, values: list[tuple[int, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, value in values:
        producer.produce(topic, value, b"k", partition)
    assert producer.flush(30) == 0


def serialized(registry: SchemaRegistry, topic: str) -> tuple[list[tuple[int, bytes | None]], int]:
    client = SchemaRegistryClient(registry.client_conf)
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(V1))
    v2 = AvroSerializer(client, json.dumps(V2))
    values: list[tuple[int, bytes | None]] = []
    for n in range(3_000):
        value = v2(order(n, coupon=True), context) if n >= 2_000 else v1(order(n), context)
        values.append((n % PARTITIONS, value))
    return values, 3_000


def land(
    broker: KafkaCluster,
    tmp_path: Path,
    topic: str,
    value: dict[str, Any],
    registry: dict[str, Any],
    *,
    group: str | None = None,
    key: dict[str, Any] | None = None,
) -> IngestConfig:
    """``ingest run --until-end`` (in this process) of ``topic`` into a table under
    ``tmp_path``, on the local engine; its config."""
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group or unique_name("g"),
        table=tmp_path / "table",
        sections={"table": {"value": value, "key": key or {}}, "schema_registry": registry},
    )
    cfg = load_config(path)
    engine = group_run(cfg, until_end=True)
    assert isinstance(engine.lander, LocalEngine)  # decoded in the local engine's task processes
    outcome = engine.run()
    assert outcome.exit_code == 0, outcome.message
    return cfg


@pytest.mark.quick
def test_avro_values_land_as_columns_and_bad_ones_as_dead_letters(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    topic = unique_name("avro")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    values, count = serialized(schema_registry, topic)
    good = values[5][1]
    assert good is not None and good[0] == 0
    bad: list[tuple[int, bytes | None]] = [
        (0, b"\x01" + good[1:]),  # not the magic byte
        (1, good[:3]),  # shorter than the header
        (0, good[:-4]),  # the datum cut short
        (1, b"\x00\x00\x0f\x42\x3f" + good[5:]),  # schema id 999,999: unknown
    ]
    produce(broker.bootstrap, topic, values + bad)
    registry = {"urls": [schema_registry.url], "retry_timeout": "2s", "on_error": "dead_letter"}
    cfg = land(broker, tmp_path, topic, {"format": "avro", "schema": DDL}, registry)
    verdict = verify_exact(
        broker.bootstrap,
        topic,
        cfg.source.group_id,
        cfg.table.uri,
        dead_letter_uri=cfg.dead_letter_uri(),
    )
    verdict.raise_if_not_exact()
    assert verdict.dead_letters == len(bad)
    table = DeltaTable(cfg.table.uri).to_pyarrow_table()
    assert table.num_rows == count
    schema = table.schema
    assert schema.field("amount").type == pa.decimal128(10, 2)
    assert schema.field("placed").type == pa.timestamp("us", tz="UTC")
    assert schema.field("day").type == pa.date32()
    assert schema.field("address").type == pa.struct([("city", pa.string()), ("zip", pa.int32())])
    rows = {row["id"]: row for row in table.to_pylist()}
    for n in (0, 1, 1_999, 2_000, 2_999):
        want = order(n, coupon=n >= 2_000)
        got = rows[n]
        for name in ("customer", "amount", "day", "status", "tags", "note", "address"):
            assert got[name] == want[name], (n, name)
        assert got["placed"] == want["placed"]
        assert got["coupon"] == want.get("coupon")  # null for V1's records
    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    reasons = sorted(str(row["error_message"]) for row in dead)
    assert any("magic byte 1" in r for r in reasons), reasons
    assert any("fewer than 5" in r for r in reasons), reasons
    assert any("undecodable Avro payload" in r for r in reasons), reasons
    assert any("schema id 999999" in r for r in reasons), reasons


def test_without_a_ddl_the_columns_are_the_subjects_latest_schema(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    topic = unique_name("avro-latest")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    values, count = serialized(schema_registry, topic)
    produce(broker.bootstrap, topic, values)
    cfg = land(broker, tmp_path, topic, {"format": "avro"}, {"urls": [schema_registry.url]})
    table = DeltaTable(cfg.table.uri).to_pyarrow_table()
    assert table.num_rows == count
    assert "coupon" in table.column_names  # V2, the latest
    assert table.schema.field("status").type == pa.string()  # an enum: its symbol


def test_a_schema_polars_cannot_read_goes_a_record_at_a_time(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    """A map, a union of two types and a time: fastavro's route, the same columns as
    Spark's from_avro (member0/member1, time-millis as an int)."""
    topic = unique_name("avro-slow")
    create_topic(broker.bootstrap, topic, partitions=1)
    schema = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "labels", "type": {"type": "map", "values": "long"}},
            {"name": "reading", "type": ["null", "string", "double"]},
            {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
        ],
    }
    serializer = AvroSerializer(
        SchemaRegistryClient(schema_registry.client_conf), json.dumps(schema)
    )
    context = SerializationContext(topic, MessageField.VALUE)
    rows = [
        {"labels": {"a": n}, "reading": f"s{n}" if n % 2 else float(n), "at": dt.time(1, 2, 3)}
        for n in range(200)
    ]
    produce(broker.bootstrap, topic, [(0, serializer(r, context)) for r in rows])
    cfg = land(broker, tmp_path, topic, {"format": "avro"}, {"urls": [schema_registry.url]})
    table = DeltaTable(cfg.table.uri).to_pyarrow_table().sort_by("offset")
    assert table.num_rows == 200
    first, second = table.slice(0, 2).to_pylist()
    assert first["labels"] == [("a", 0)]
    assert first["reading"] == {"member0": None, "member1": 0.0}
    assert second["reading"] == {"member0": "s1", "member1": None}
    assert first["at"] == (3600 + 2 * 60 + 3) * 1000


@pytest.mark.parametrize(
    ("sections", "key", "message"),
    [
        ({"table": {"value": {"format": "avro"}}}, "schema_registry", "needs a [schema_registry]"),
        (
            {
                "table": {"value": {"format": "avro"}},
                "schema_registry": {
                    "urls": ["http://127.0.0.1:1"],
                    "subject_name_strategy": "record",
                },
            },
            "schema_registry.record_name",
            "needs the record name",
        ),
        (
            {"table": {"value": {"format": "avro"}}, "schema_registry": {"urls": []}},
            "schema_registry.urls",
            "needs at least one URL",
        ),
    ],
)
def test_avro_config_errors(
    tmp_path: Path, sections: dict[str, Any], key: str, message: str
) -> None:
    path = write_config(
        tmp_path / "run.toml",
        bootstrap="127.0.0.1:9092",
        topic="t",
        group="g",
        table=tmp_path / "table",
        sections=sections,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key
    assert message in str(caught.value)


def test_a_datum_with_bytes_too_many_does_not_shift_the_next_ones(
    schema_registry: SchemaRegistry,
) -> None:
    """In one block of an object container a datum with a byte too many decodes the next
    datums from the wrong place, without an error (with two longs, any bytes are valid);
    the size check reads them again a block each, and every row keeps its own values
    (the extra byte ignored, as Confluent's deserializers do)."""
    from ingest.formats.framed import FramedSpec, decode_framed
    from ingest.registry import RegistrySettings

    schema = {
        "type": "record",
        "name": "Pair",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "long"}],
    }
    topic = unique_name("avro-unit")
    client = SchemaRegistryClient(schema_registry.client_conf)
    serializer = AvroSerializer(client, json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    values: list[bytes | None] = [serializer({"a": n, "b": 10 * n}, context) for n in range(500)]
    values[100] = (values[100] or b"") + b"\x02"  # a byte too many: a long 1 to a reader
    values[300] = None  # a tombstone kept as a row: every field null
    columns = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.int64())])
    spec = FramedSpec("avro", RegistrySettings((schema_registry.url,)), columns)
    fields, good, errors = decode_framed(pa.array(values, pa.binary()), spec)
    assert errors == []
    assert good.tolist() == list(range(500))
    assert fields.column("a").to_pylist() == [None if n == 300 else n for n in range(500)]
    assert fields.column("b").to_pylist() == [None if n == 300 else 10 * n for n in range(500)]


def test_a_registry_that_stays_down_stops_the_run_and_commits_nothing(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    """on_error "fail": each batch attempt retries the registry for retry_timeout; an
    unreachable registry is transient, so the batch is retried for trigger.retry_for (4 s
    here: three attempts) and the run stops naming the registry and the budget; no row,
    no dead letter and no offset are committed, so a rerun with the registry back lands
    everything."""
    topic = unique_name("avro-down")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    values, count = serialized(schema_registry, topic)
    produce(broker.bootstrap, topic, values)
    down = {"urls": ["http://127.0.0.1:9/apis/ccompat/v7"], "retry_timeout": "500ms"}
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g"),
        table=tmp_path / "table",
        sections={
            "table": {"value": {"format": "avro", "schema": DDL}},
            "schema_registry": down,
            "trigger": {"retry_for": "4s"},
        },
    )
    cfg = load_config(path)
    outcome = group_run(cfg, until_end=True).run()
    assert outcome.exit_code == 1
    assert "schema registry did not answer" in outcome.message, outcome.message
    assert "3 times in a row" in outcome.message, outcome.message
    assert "(trigger.retry_for = 4s)" in outcome.message, outcome.message
    assert not (tmp_path / "table" / "_delta_log").exists() or (
        DeltaTable(cfg.table.uri).to_pyarrow_table().num_rows == 0
    )
    partitions = [Partition(topic, p) for p in range(PARTITIONS)]
    assert set(group_offsets(cfg, partitions).values()) == {None}
    # The registry back: a rerun of the same group lands every record once.
    registry = {"urls": [schema_registry.url]}
    cfg = land(
        broker,
        tmp_path,
        topic,
        {"format": "avro", "schema": DDL},
        registry,
        group=cfg.source.group_id,
    )
    verify_exact(
        broker.bootstrap,
        topic,
        cfg.source.group_id,
        cfg.table.uri,
        dead_letter_uri=cfg.dead_letter_uri(),
    ).raise_if_not_exact()
    assert DeltaTable(cfg.table.uri).to_pyarrow_table().num_rows == count
