"""Tombstones and Debezium change events in the Spark job: records produced through the
real broker, drained by real workers, landed in Delta by ``run_batch``.

Each ``land`` below drains the topic from its start; the table's txn versions drop what
an earlier batch of the same group landed, so a later batch holds only the records
produced since (as a run would). ``verify_upsert`` replays the topic by the rule each
test states and compares it with the table.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from deltalake import DeltaTable

from ingest.engines.spark.job import Batch, BatchResult, run_batch
from ingest.errors import ConfigError
from ingest.handoff import HandoffConfig, HandoffStore
from ingest.sink.table_config import TableConfig
from ingest.testing import (
    Change,
    ConsumedRecord,
    KafkaCluster,
    ProducedRecord,
    create_topic,
    produce,
    unique_name,
    verify_upsert,
)
from tests.sink.support import delta_rows, drain

pytestmark = pytest.mark.spark

SCHEMA = "id BIGINT, name STRING"
PARTITIONS = 2


@pytest.fixture
def store() -> Iterator[HandoffStore]:
    with HandoffStore(HandoffConfig(segment_max_bytes=4 * 1024)) as handoff:
        yield handoff


class Topic:
    def __init__(self, broker: KafkaCluster, store: HandoffStore) -> None:
        self.broker, self.store = broker, store
        self.name = unique_name("t-deletes")
        self.landed: tuple[Any, ...] = ()  # the segments of the last land
        create_topic(broker.bootstrap, self.name, partitions=PARTITIONS)

    def produce(self, records: list[ProducedRecord]) -> None:
        produce(self.broker.bootstrap, self.name, records)

    def land(self, spark: Any, config: TableConfig) -> BatchResult:
        self.landed = tuple(drain(self.broker, self.store, self.name, PARTITIONS))
        return run_batch(spark, Batch(config, self.landed))

    def verify(
        self,
        config: TableConfig,
        change_of: Callable[[ConsumedRecord], Change | None],
        dead: Callable[[ConsumedRecord], bool],
    ) -> None:
        verify_upsert(
            self.broker.bootstrap,
            self.name,
            None,
            config.uri,
            key_columns=list(config.merge_keys),
            change_of=change_of,
            dead_letter_uri=config.dead_letters,
            dead=dead,
        ).raise_if_not_exact()


@pytest.fixture
def topic(broker: KafkaCluster, store: HandoffStore) -> Topic:
    return Topic(broker, store)


def upsert(n: int, name: str) -> ProducedRecord:
    return ProducedRecord(orjson.dumps({"id": n, "name": name}), key=b"%d" % n)


def tombstone(n: int) -> ProducedRecord:
    return ProducedRecord(None, key=b"%d" % n)


def names(uri: str) -> dict[int, str | None]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=["id", "name"]).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key has two rows"
    return {r["id"]: r["name"] for r in rows}


def config(tmp_path: Path, **changes: Any) -> TableConfig:
    base = TableConfig(
        uri=str(tmp_path / "t"),
        group="g",
        mode="upsert",
        merge_keys=("id",),
        value_format="json",
        value_schema=SCHEMA,
    )
    return dataclasses.replace(base, **changes)


def by_value_or_key(record: ConsumedRecord) -> Change | None:
    if record.value is None:
        assert record.key is not None
        return Change((int(record.key),), delete=True)
    return Change((orjson.loads(record.value)["id"],))


def is_tombstone(record: ConsumedRecord) -> bool:
    return record.value is None


def never(record: ConsumedRecord) -> bool:
    return False


# -- table.tombstones ----------------------------------------------------------------------


def test_each_tombstones_mode_in_upsert(spark: Any, topic: Topic, tmp_path: Path) -> None:
    topic.produce([upsert(n, "a") for n in range(10)])
    topic.produce([tombstone(n) for n in range(4)] + [upsert(9, "b")])
    modes = {mode: config(tmp_path / mode, tombstones=mode) for mode in ("delete", "ignore")}
    modes["dead_letter"] = config(tmp_path / "dead_letter", tombstones="dead_letter")
    assert config(tmp_path).tombstones == "delete"  # upsert's default
    results = {mode: topic.land(spark, cfg) for mode, cfg in modes.items()}

    assert names(modes["delete"].uri) == {**{n: "a" for n in range(4, 9)}, 9: "b"}
    assert results["delete"].deleted_rows == 0  # one batch: the keys never reached the table
    kept = {**{n: "a" for n in range(9)}, 9: "b"}
    assert names(modes["ignore"].uri) == kept
    assert names(modes["dead_letter"].uri) == kept
    dead = delta_rows(modes["dead_letter"].dead_letters).to_pylist()
    assert sorted(int(r["key"]) for r in dead) == [0, 1, 2, 3]
    assert {r["error_stage"] for r in dead} == {"decode"}
    assert {r["error_message"] for r in dead} == {
        'a tombstone (null value), dead-lettered by table.tombstones = "dead_letter"'
    }
    topic.verify(modes["delete"], by_value_or_key, never)

    def ignored(record: ConsumedRecord) -> Change | None:
        return None if record.value is None else by_value_or_key(record)

    topic.verify(modes["ignore"], ignored, never)
    topic.verify(modes["dead_letter"], ignored, is_tombstone)


def test_deletes_across_batches_and_an_older_delete_never_removes_a_newer_row(
    spark: Any, topic: Topic, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    topic.produce([upsert(n, "a") for n in range(6)])
    topic.land(spark, cfg)
    topic.produce([tombstone(0), tombstone(1), upsert(2, "b"), tombstone(2), tombstone(3)])
    older = topic.land(spark, cfg)
    old = topic.landed  # offsets through the deletes, before the re-creation
    assert older.deleted_rows == 4 and names(cfg.uri) == {4: "a", 5: "a"}
    topic.produce([upsert(1, "c"), tombstone(4)])
    newer = topic.land(spark, cfg)
    assert newer.deleted_rows == 1 and names(cfg.uri) == {1: "c", 5: "a"}
    topic.verify(cfg, by_value_or_key, never)
    # Exactly once: the same offsets again change nothing, not even the version.
    version = DeltaTable(cfg.uri).version()
    again = topic.land(spark, cfg)
    assert (again.rows_written, again.deleted_rows) == (0, 0)
    assert DeltaTable(cfg.uri).version() == version

    # Another group lands only the older offsets after the newer ones are in: its delete
    # of key 1 (an offset below the re-creation's) leaves the row, and its txn versions
    # are committed with the merge. (Its older values of keys deleted since come back:
    # a deleted row leaves nothing to compare with; ingest.sink.merging.merge's docstring.)
    other = dataclasses.replace(cfg, group="g2")
    replayed = run_batch(spark, Batch(other, old))
    assert replayed.table_version == version + 1
    assert names(cfg.uri)[1] == "c"


def test_tombstones_in_append_mode(spark: Any, topic: Topic, tmp_path: Path) -> None:
    topic.produce([upsert(0, "a"), tombstone(0), upsert(1, "a"), tombstone(1)])
    base = TableConfig(uri=str(tmp_path / "keep"), group="g")
    assert base.tombstones == "keep"  # append's default: a row with a null value
    topic.land(spark, base)
    assert delta_rows(base.uri).column("value").null_count == 2
    ignore = TableConfig(uri=str(tmp_path / "ignore"), group="g", tombstones="ignore")
    topic.land(spark, ignore)
    assert delta_rows(ignore.uri).num_rows == 2
    assert delta_rows(ignore.uri).column("value").null_count == 0
    dead = TableConfig(uri=str(tmp_path / "dead"), group="g", tombstones="dead_letter")
    topic.land(spark, dead)
    assert delta_rows(dead.uri).num_rows == 2 and delta_rows(dead.dead_letters).num_rows == 2
    with pytest.raises(ConfigError, match=re.escape('table.tombstones: needs mode "upsert"')):
        TableConfig(uri="/t", group="g", tombstones="delete")
    with pytest.raises(ConfigError, match=re.escape("table.tombstones: applies to append mode")):
        TableConfig(uri="/t", group="g", mode="upsert", merge_keys=("id",), tombstones="keep")


def test_a_kafka_key_merge_key_and_a_transform_that_keeps_the_delete_column(
    spark: Any, topic: Topic, tmp_path: Path
) -> None:
    topic.produce([upsert(n, "a") for n in range(4)] + [tombstone(1), tombstone(2)])
    by_key = TableConfig(uri=str(tmp_path / "k"), group="g", mode="upsert", merge_keys=("key",))
    topic.land(spark, by_key)
    assert sorted(delta_rows(by_key.uri).column("key").to_pylist()) == [b"0", b"3"]
    assert "_delete" not in delta_rows(by_key.uri).column_names

    transformed = config(
        tmp_path / "tr",
        transform="SELECT id, upper(name) AS name, topic, partition, offset, _delete FROM batch",
    )
    topic.land(spark, transformed)
    assert names(transformed.uri) == {0: "A", 3: "A"}
    forgets = config(
        tmp_path / "forgets", transform="SELECT id, name, topic, partition, offset FROM batch"
    )
    with pytest.raises(ConfigError, match=r"must keep the columns \['_delete'\]"):
        topic.land(spark, forgets)


# -- Debezium change events ---------------------------------------------------------------

# The MySQL tutorial's customers table, as Debezium's documentation shows its events.
_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": False, "field": "first_name"},
    {"type": "string", "optional": False, "field": "last_name"},
    {"type": "string", "optional": False, "field": "email"},
]
_ROW_SCHEMA = {
    "type": "struct",
    "fields": _FIELDS,
    "optional": True,
    "name": "dbserver1.inventory.customers.Value",
}
_VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {**_ROW_SCHEMA, "field": "before"},
        {**_ROW_SCHEMA, "field": "after"},
        {
            "type": "struct",
            "fields": [
                {"type": "string", "optional": False, "field": "version"},
                {"type": "string", "optional": False, "field": "connector"},
                {"type": "string", "optional": False, "field": "name"},
                {"type": "int64", "optional": False, "field": "ts_ms"},
                {"type": "string", "optional": True, "field": "db"},
                {"type": "string", "optional": True, "field": "table"},
            ],
            "optional": False,
            "name": "io.debezium.connector.mysql.Source",
            "field": "source",
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "dbserver1.inventory.customers.Envelope",
}
_KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "int32", "optional": False, "field": "id"}],
    "optional": False,
    "name": "dbserver1.inventory.customers.Key",
}
CUSTOMERS = "id BIGINT, first_name STRING, last_name STRING, email STRING"


def customer(n: int, email: str) -> dict[str, Any]:
    return {"id": n, "first_name": "Sally", "last_name": "Thomas", "email": email}


def event(
    op: str,
    n: int,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    *,
    schemas: bool,
) -> ProducedRecord:
    """A record as the Debezium MySQL connector writes it through the JsonConverter, with
    ``schemas.enable`` true (schema/payload) or false (the payload alone)."""
    payload = {
        "before": before,
        "after": after,
        "source": {
            "version": "2.7.0.Final",
            "connector": "mysql",
            "name": "dbserver1",
            "ts_ms": 1486500577000,
            "db": "inventory",
            "table": "customers",
        },
        "op": op,
        "ts_ms": 1486500577691,
        "transaction": None,
    }
    key: Any = {"id": n}
    value: Any = payload
    if schemas:
        key = {"schema": _KEY_SCHEMA, "payload": key}
        value = {"schema": _VALUE_SCHEMA, "payload": payload}
    return ProducedRecord(orjson.dumps(value), key=orjson.dumps(key))


def delete_then_tombstone(n: int, before: dict[str, Any], *, schemas: bool) -> list[ProducedRecord]:
    """A delete, and the tombstone Debezium follows it with (same key)."""
    d = event("d", n, before, None, schemas=schemas)
    return [d, ProducedRecord(None, key=d.key)]


def key_id(raw: bytes | None) -> int:
    assert raw is not None
    document = orjson.loads(raw)
    return int(document.get("payload", document)["id"])


def debezium_change(record: ConsumedRecord) -> Change | None:
    """The rule the verifier replays: c/u/r upsert ``after``, d and tombstones delete."""
    if record.value is None:
        return Change((key_id(record.key),), delete=True)
    document = orjson.loads(record.value)
    payload = document.get("payload", document)
    if payload["op"] == "d":
        return Change((key_id(record.key),), delete=True)
    return Change((payload["after"]["id"],))


MALFORMED = {
    b"not json": "invalid JSON",
    b'{"id": 7, "first_name": "no envelope"}': 'no "op"',
    orjson.dumps(
        {"before": None, "after": None, "op": "c"}
    ): 'a Debezium "c" event without "after"',
    orjson.dumps({"before": None, "after": None, "op": "t"}): 'a Debezium truncate (op "t")',
    orjson.dumps({"before": None, "after": None, "op": "x"}): "unknown Debezium op 'x'",
    orjson.dumps({"before": None, "after": {"id": "seven"}, "op": "c"}): "",  # a type error
}


def is_malformed(record: ConsumedRecord) -> bool:
    return record.value in MALFORMED or (
        record.value is not None and b'"op":"d"' in record.value and record.key == b"{}"
    )


@pytest.mark.parametrize("schemas", [False, True], ids=["plain", "schema-payload"])
def test_debezium_change_events_upsert_and_delete(
    spark: Any, topic: Topic, tmp_path: Path, schemas: bool
) -> None:
    cfg = config(tmp_path, value_schema=CUSTOMERS, value_envelope="debezium", tombstones="ignore")
    # The snapshot (r) and a create (c).
    topic.produce(
        [event("r", n, None, customer(n, f"s{n}@x"), schemas=schemas) for n in range(1001, 1005)]
        + [event("c", 1005, None, customer(1005, "new@x"), schemas=schemas)]
    )
    topic.land(spark, cfg)
    assert {k: v for k, v in emails(cfg.uri).items()} == {
        **{n: f"s{n}@x" for n in range(1001, 1005)},
        1005: "new@x",
    }
    # Updates, deletes each followed by their tombstone, a delete then re-create and an
    # update then delete in one batch, and malformed events.
    topic.produce(
        [event("u", 1001, customer(1001, "s1001@x"), customer(1001, "u@x"), schemas=schemas)]
        + delete_then_tombstone(1002, customer(1002, "s1002@x"), schemas=schemas)
        + delete_then_tombstone(1003, customer(1003, "s1003@x"), schemas=schemas)
        + [event("c", 1003, None, customer(1003, "again@x"), schemas=schemas)]
        + [event("u", 1004, customer(1004, "s1004@x"), customer(1004, "v@x"), schemas=schemas)]
        + delete_then_tombstone(1004, customer(1004, "v@x"), schemas=schemas)
        # A delete whose before is null (the key names the row), and one nothing names.
        + [event("d", 1005, None, None, schemas=schemas)]
        + [ProducedRecord(orjson.dumps({"before": None, "after": None, "op": "d"}), key=b"{}")]
        + [ProducedRecord(value, key=b'{"id": 7}') for value in MALFORMED]
    )
    result = topic.land(spark, cfg)
    assert emails(cfg.uri) == {1001: "u@x", 1003: "again@x"}
    assert result.deleted_rows == 3  # 1002, 1004, 1005; 1003 was deleted and re-created
    dead = {bytes(r["value"]): r for r in delta_rows(cfg.dead_letters).to_pylist()}
    assert len(dead) == len(MALFORMED) + 1
    for value, message in MALFORMED.items():
        row = dead[value]
        assert message in row["error_message"] and row["error_stage"] == "decode"
        assert row["key"] == b'{"id": 7}' and row["topic"] == topic.name
    nameless = dead[orjson.dumps({"before": None, "after": None, "op": "d"})]
    assert nameless["error_message"] == "the key b'{}' does not give the field 'id'"
    topic.verify(cfg, lambda r: None if r.value is None else debezium_change(r), is_malformed)
    # With tombstones = "delete" the tombstone after each delete deletes again: same table.
    deleting = config(tmp_path / "delete", value_schema=CUSTOMERS, value_envelope="debezium")
    topic.land(spark, deleting)
    assert emails(deleting.uri) == {1001: "u@x", 1003: "again@x"}
    topic.verify(deleting, debezium_change, is_malformed)


def emails(uri: str) -> dict[int, str]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=["id", "email"]).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key has two rows"
    return {r["id"]: r["email"] for r in rows}


def test_debezium_needs_json_in_upsert_mode() -> None:
    with pytest.raises(ConfigError, match=re.escape('table.value.envelope: needs mode "upsert"')):
        TableConfig(
            uri="/t", group="g", value_format="json", value_schema=SCHEMA, value_envelope="debezium"
        )
    with pytest.raises(ConfigError, match=re.escape('table.value.envelope: needs format "json"')):
        TableConfig(
            uri="/t", group="g", mode="upsert", merge_keys=("key",), value_envelope="debezium"
        )
