"""Avro writers' schemas that change under a running table (ingest/formats/framed.py).

The table's columns come from the subject's latest schema (V1 here). Later writers'
schemas, registered under subjects of their own (the record strategies), reach the same
topic: one adds an optional field, which becomes a column in the same Delta commit as
the rows that carry it; one changes a field's type, one drops a field V1 requires: their
records are dead letters naming the schema id and the column, or, configured so, the
run stops with nothing committed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import (
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from ingest.config import load_config
from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from tests.registry.test_avro_values import PARTITIONS, V1, V2, land, order, produce
from tests.runtime.support import group_offsets, write_config


def _writer(name: str, change: Any) -> dict[str, Any]:
    """V1 under another record name (so another subject), changed by ``change``."""
    schema = copy.deepcopy(V1)
    schema["name"] = name
    schema["fields"] = [f for f in (change(f) for f in schema["fields"]) if f is not None]
    return schema


# id as a string: a type that is no promotion of BIGINT.
RETYPED = _writer("OrderRetyped", lambda f: {**f, "type": "string"} if f["name"] == "id" else f)
# No customer, which V1 (the table's schema) requires.
NO_CUSTOMER = _writer("OrderNoCustomer", lambda f: None if f["name"] == "customer" else f)


class Writers:
    """Serializers of one topic: V1 under ``<topic>-value``, the others under their own
    subjects (``shop.Order`` for V2, ``<topic>-shop.<name>`` for the rest)."""

    def __init__(self, registry: SchemaRegistry, topic: str) -> None:
        client = SchemaRegistryClient(registry.client_conf)
        self.context = SerializationContext(topic, MessageField.VALUE)
        self.v1 = AvroSerializer(client, json.dumps(V1))
        self.v2 = AvroSerializer(
            client, json.dumps(V2), conf={"subject.name.strategy": record_subject_name_strategy}
        )
        by_topic_record = {"subject.name.strategy": topic_record_subject_name_strategy}
        self.retyped = AvroSerializer(client, json.dumps(RETYPED), conf=by_topic_record)
        self.no_customer = AvroSerializer(client, json.dumps(NO_CUSTOMER), conf=by_topic_record)

    def values(self, serializer: AvroSerializer, numbers: range, **extra: Any) -> list[Any]:
        out = []
        for n in numbers:
            value = order(n, coupon=serializer is self.v2)
            if serializer is self.retyped:
                value["id"] = str(n)
            if serializer is self.no_customer:
                del value["customer"]
            out.append((n % PARTITIONS, serializer(value, self.context)))
        return out


def _commits(table_uri: str) -> list[list[dict[str, Any]]]:
    log = Path(table_uri) / "_delta_log"
    return [
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(log.glob("*.json"))
    ]


def test_a_new_field_adds_a_column_in_its_rows_commit_and_misfits_are_dead_letters(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    topic = unique_name("avro-evolve")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    writers = Writers(schema_registry, topic)
    produce(broker.bootstrap, topic, writers.values(writers.v1, range(300)))
    registry = {"urls": [schema_registry.url]}
    cfg = land(broker, tmp_path, topic, {"format": "avro"}, registry)
    assert "coupon" not in DeltaTable(cfg.table.uri).schema().to_arrow().names
    before = len(_commits(cfg.table.uri))

    # A second run of the group, with V2's and the misfits' records arriving.
    later = (
        writers.values(writers.v2, range(300, 600))
        + writers.values(writers.retyped, range(600, 650))
        + writers.values(writers.no_customer, range(650, 700))
    )
    produce(broker.bootstrap, topic, later)
    cfg = land(broker, tmp_path, topic, {"format": "avro"}, registry, group=cfg.source.group_id)
    verdict = verify_exact(
        broker.bootstrap,
        topic,
        cfg.source.group_id,
        cfg.table.uri,
        dead_letter_uri=cfg.dead_letter_uri(),
    )
    verdict.raise_if_not_exact()
    assert verdict.dead_letters == 100

    # The commit that added the column is the one that holds V2's rows (and their txns).
    widened = [
        commit
        for commit in _commits(cfg.table.uri)[before:]
        if any("coupon" in a.get("metaData", {}).get("schemaString", "") for a in commit)
    ]
    assert len(widened) == 1
    adds = [a["add"] for a in widened[0] if "add" in a]
    assert adds and sum(json.loads(a["stats"])["numRecords"] for a in adds) > 0
    assert any("txn" in a for a in widened[0])
    assert not any("remove" in a for a in widened[0])  # the "overwrite" removes nothing

    table = DeltaTable(cfg.table.uri).to_pyarrow_table()
    assert table.num_rows == 600
    coupons = {row["id"]: row["coupon"] for row in table.select(["id", "coupon"]).to_pylist()}
    assert coupons[0] is None and coupons[299] is None  # V1's rows
    assert coupons[300] == "C300" and coupons[599] == "C599"

    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    reasons = {str(row["error_message"]) for row in dead}
    client = SchemaRegistryClient(schema_registry.client_conf)
    retyped_id = client.get_latest_version(f"{topic}-shop.OrderRetyped").schema_id
    missing_id = client.get_latest_version(f"{topic}-shop.OrderNoCustomer").schema_id
    assert any(
        f"schema id {retyped_id} " in r and "id: string where the table has int64" in r
        for r in reasons
    ), reasons
    assert any(f"schema id {missing_id} " in r and "customer: missing" in r for r in reasons), (
        reasons
    )
    assert len(reasons) == 2  # one reason per schema id


def test_a_misfit_stops_the_run_when_configured_and_nothing_is_committed(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    topic = unique_name("avro-misfit")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    writers = Writers(schema_registry, topic)
    produce(
        broker.bootstrap,
        topic,
        writers.values(writers.v1, range(100)) + writers.values(writers.retyped, range(100, 110)),
    )
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g"),
        table=tmp_path / "table",
        sections={
            "table": {"value": {"format": "avro", "on_incompatible": "fail"}},
            "schema_registry": {"urls": [schema_registry.url]},
        },
    )
    cfg = load_config(path)
    outcome = group_run(cfg, until_end=True).run()
    assert outcome.exit_code == 2, outcome.message
    assert "does not fit the table" in outcome.message
    assert "id: string where the table has int64" in outcome.message
    table = tmp_path / "table"
    assert (
        not (table / "_delta_log").exists()
        or DeltaTable(str(table)).to_pyarrow_table().num_rows == 0
    )
    partitions = [Partition(topic, p) for p in range(PARTITIONS)]
    assert set(group_offsets(cfg, partitions).values()) == {None}


def test_a_new_field_named_like_a_kafka_column_is_incompatible(
    schema_registry: SchemaRegistry,
) -> None:
    """A writer's new field ``offset`` would clash with ingest's own column: its records
    are dead letters saying so (before: the batch failed on a duplicate column)."""
    import pyarrow as pa

    from ingest.formats.decode import DecodeSpec, decode
    from ingest.formats.framed import FramedSpec
    from ingest.registry import RegistrySettings

    schema = {
        "type": "record",
        "name": "Clash",
        "fields": [{"name": "id", "type": "long"}, {"name": "offset", "type": "long"}],
    }
    client = SchemaRegistryClient(schema_registry.client_conf)
    context = SerializationContext(unique_name("avro-clash"), MessageField.VALUE)
    value = AvroSerializer(client, json.dumps(schema))({"id": 1, "offset": 7}, context)
    framed = FramedSpec(
        "avro",
        RegistrySettings((schema_registry.url,)),
        pa.schema([pa.field("id", pa.int64())]),
        reserved=frozenset({"topic", "partition", "offset", "timestamp", "key", "value"}),
    )
    records = pa.table(
        {
            "topic": pa.array(["t"]),
            "partition": pa.array([0], pa.int32()),
            "offset": pa.array([5], pa.int64()),
            "timestamp": pa.array([0], pa.timestamp("us", tz="UTC")),
            "timestamp_type": pa.array([0], pa.int8()),
            "key": pa.array([None], pa.binary()),
            "value": pa.array([value], pa.binary()),
            "headers": pa.array([[]], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        }
    )  # fmt: skip
    decoded = decode(records, DecodeSpec("avro", framed=framed))
    assert decoded.rows.num_rows == 0
    [reason] = decoded.dead.column("error_message").to_pylist()
    assert "new fields offset have the names of ingest's own columns" in reason
