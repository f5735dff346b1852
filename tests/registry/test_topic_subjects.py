"""A topic pattern into a table per topic (``table.uri = ".../{topic}"``), Avro values
with each topic's schema under its own subject (``<topic>-value``, the topic strategy)
and no DDL: each table is created at its topic's first batch with the columns of its own
subject's latest schema, exactly once. A topic whose subject does not exist stops the
run naming it, with nothing of it committed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from ingest.config import load_config
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from tests.registry.test_avro_values import PARTITIONS, V1, order, produce
from tests.runtime.support import write_config

CLICK: dict[str, Any] = {
    "type": "record",
    "name": "Click",
    "namespace": "web",
    "fields": [
        {"name": "page", "type": "string"},
        {"name": "ms", "type": "int"},
        {"name": "ref", "type": ["null", "string"], "default": None},
    ],
}


def _serialized(
    registry: SchemaRegistry, topic: str, schema: dict[str, Any], values: list[dict[str, Any]]
) -> list[tuple[int, bytes | None]]:
    serializer = AvroSerializer(SchemaRegistryClient(registry.client_conf), json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    return [(n % PARTITIONS, serializer(v, context)) for n, v in enumerate(values)]


def _config(broker: KafkaCluster, registry: SchemaRegistry, tmp_path: Path, prefix: str) -> Path:
    return write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic="unused",
        group=unique_name("g"),
        table=tmp_path / "lake" / "{topic}",
        sections={
            "source": {"topics": [], "topic_pattern": re.escape(prefix) + r"\..+"},
            "table.value": {"format": "avro"},
            "schema_registry": {"urls": [registry.url]},
            "spark": {"engine": "local"},
        },
    )


def test_each_topic_table_takes_the_columns_of_its_own_subject(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    prefix = unique_name("subj")
    orders, clicks = (
        create_topic(broker.bootstrap, f"{prefix}.{name}", partitions=PARTITIONS)
        for name in ("orders", "clicks")
    )
    produce(
        broker.bootstrap,
        orders,
        _serialized(schema_registry, orders, V1, [order(n) for n in range(200)]),
    )
    click_values = [
        {"page": f"/p{n % 9}", "ms": n, "ref": None if n % 2 else "x"} for n in range(150)
    ]
    produce(broker.bootstrap, clicks, _serialized(schema_registry, clicks, CLICK, click_values))
    cfg = load_config(_config(broker, schema_registry, tmp_path, prefix))
    outcome = group_run(cfg, until_end=True).run()
    assert outcome.exit_code == 0, outcome.message

    lake = tmp_path / "lake"
    for topic in (orders, clicks):
        verify_exact(
            broker.bootstrap,
            topic,
            cfg.source.group_id,
            str(lake / topic),
            dead_letter_uri=str(lake / f"{topic}_dead_letters"),
        ).raise_if_not_exact()
    order_columns = DeltaTable(str(lake / orders)).schema().to_arrow().names
    assert {"id", "customer", "amount", "address"} <= set(order_columns)
    assert "page" not in order_columns
    landed = DeltaTable(str(lake / clicks)).to_pyarrow_table().sort_by("ms")
    assert {"page", "ms", "ref"} <= set(
        landed.column_names
    ) and "customer" not in landed.column_names
    assert landed.column("page").to_pylist() == [v["page"] for v in click_values]
    assert not (lake / f"{orders}_dead_letters").exists()


def test_a_topic_without_a_subject_stops_the_run_naming_it(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    prefix = unique_name("nosubj")
    topic = create_topic(broker.bootstrap, f"{prefix}.raw", partitions=PARTITIONS)
    # Framed like Avro, under an id the registry has, but the topic's subject was never
    # registered (its producer used another subject).
    serializer = AvroSerializer(
        SchemaRegistryClient(schema_registry.client_conf),
        json.dumps(CLICK),
        conf={"auto.register.schemas": True, "subject.name.strategy": lambda ctx, name: name},
    )
    context = SerializationContext(topic, MessageField.VALUE)
    produce(
        broker.bootstrap,
        topic,
        [(0, serializer({"page": "/", "ms": 1, "ref": None}, context))],
    )
    cfg = load_config(_config(broker, schema_registry, tmp_path, prefix))
    outcome = group_run(cfg, until_end=True).run()
    assert outcome.exit_code == 2
    assert f"{topic}-value" in outcome.message and "no columns" in outcome.message
    assert not (tmp_path / "lake" / topic / "_delta_log").exists()
