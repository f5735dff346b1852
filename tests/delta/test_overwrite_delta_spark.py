"""``ingest replay --overwrite`` on tables only Delta Spark's transaction can cut: deletion
vectors (a remove must name the file's vector), row tracking, clustering, in-commit
timestamps, v2 checkpoints, vacuumProtocolCheck, widened types, VARIANT columns
(``ingest/sink/overwrite.py``, ``DeltaSparkCommitter.replace``); and tables whose rows
Delta Spark's writer must check or fill.

The table is made by Delta Spark, takes ingest's appends, then Spark deletes rows inside and
outside the range to replay. The replay of partition 0's offsets [10, 30) commits once:
Delta Spark's DELETE of the range (deletion vectors where the table has them, else a
rewrite), ingest's files and a txn per partition. Spark then reads every record of the
range once (the ones it deleted there come back: the range is the topic's again), the
rows it deleted elsewhere stay deleted, every other row keeps its row id, and Spark writes
after us."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.sink.txn import REWRITE_GUARD
from ingest.supervisor.modes.replay import parse_position, replay_run
from ingest.testing import KafkaCluster, create_topic, produce, unique_name
from tests.delta.interop_support import (
    COUNT,
    IDS,
    SPARK_IDS,
    VALUE_SCHEMA,
    create_spark_table,
    run,
    spark_rows,
    spark_schema,
    topic_records,
)
from tests.runtime.support import Cli, config, write_config

pytestmark = pytest.mark.spark

RUN_TIMEOUT = 240.0

_BASE = {
    "delta.columnMapping.mode": "name",
    "delta.enableRowTracking": "true",
    "delta.enableInCommitTimestamps": "true",
}
CASES = {
    # With the other features only Delta Spark writes: v2 checkpoints, vacuumProtocolCheck,
    # a widened column and a VARIANT one (both filled in Spark's rows only).
    "deletion-vectors": {
        **_BASE,
        "delta.enableDeletionVectors": "true",
        "delta.checkpointPolicy": "v2",
        "delta.checkpointInterval": "2",
        "delta.feature.vacuumProtocolCheck": "supported",
        "delta.enableTypeWidening": "true",
        "delta.enableChangeDataFeed": "true",
    },
    # Delta Spark's DELETE rewrites files and writes change data files for the rows it cuts;
    # the replayed rows then go through its writer, with their own.
    "rewrite": {
        **_BASE,
        "delta.enableDeletionVectors": "false",
        "delta.enableChangeDataFeed": "true",
    },
}
EVERY_FEATURE = {
    "deletionVectors",
    "columnMapping",
    "rowTracking",
    "domainMetadata",
    "clustering",
    "inCommitTimestamp",
    "v2Checkpoint",
    "vacuumProtocolCheck",
    "typeWidening",
    "variantType",
}
# Spark's deletes of our rows: (partition, offset), inside the range and outside it.
DELETED_INSIDE = {(0, 10), (0, 11), (0, 25)}
DELETED_OUTSIDE = {(0, 5), (0, 50), (1, 12)}


def _log_actions(table: Path, version: int) -> list[dict[str, Any]]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _dead_letters(table: Path) -> list[tuple[Any, ...]]:
    rows = DeltaTable(f"{table}_dead_letters").to_pyarrow_table().to_pylist()
    return sorted((r["partition"], r["offset"], r["error_message"]) for r in rows)


def _where(pairs: set[tuple[int, int]]) -> str:
    return " OR ".join(f"(`partition` = {p} AND `offset` = {o})" for p, o in sorted(pairs))


@pytest.mark.parametrize("case", sorted(CASES))
def test_overwrite_through_delta_spark(
    broker: KafkaCluster, spark: Any, tmp_path: Path, case: str
) -> None:
    topic = unique_name("t-overwrite")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, topic_records())
    table = tmp_path / "table"
    create_spark_table(spark, table, properties=CASES[case], cluster_by="id")
    if case == "deletion-vectors":
        spark.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (n SMALLINT, doc VARIANT)")
        spark.sql(f"""UPDATE delta.`{table}` SET n = id, doc = parse_json('{{"a": 1}}')""")
        spark.sql(f"ALTER TABLE delta.`{table}` CHANGE COLUMN n TYPE INT")
        protocol = DeltaTable(str(table)).protocol()
        assert set(protocol.writer_features or []) >= EVERY_FEATURE, protocol
    group = unique_name("g-overwrite")
    outcome = run(
        spark, tmp_path, bootstrap=broker.bootstrap, topic=topic, table=table, group=group
    )
    assert outcome.exit_code == 0, outcome.message
    spark.sql(f"DELETE FROM delta.`{table}` WHERE {_where(DELETED_INSIDE | DELETED_OUTSIDE)}")
    every = {(n % 2, n // 2) for n in range(COUNT)}
    before = dict(
        ((p, o), row_id)
        for p, o, row_id in spark_rows(spark, table, "partition, offset, _metadata.row_id")
    )
    assert set(before) == {(-1, i) for i in SPARK_IDS} | every - DELETED_INSIDE - DELETED_OUTSIDE
    replayed_version = DeltaTable(str(table)).version() + 1

    replayed = _replay(broker, spark, tmp_path, topic, table, group)
    assert replayed.exit_code == 0, replayed.message

    # Exactly once: the range whole again, the deletes outside it kept, Spark's rows kept.
    rows = spark_rows(spark, table, "partition, offset, v, _metadata.row_id")
    held = [(p, o) for p, o, _, _ in rows]
    assert len(held) == len(set(held))
    assert set(held) == {(-1, i) for i in SPARK_IDS} | every - DELETED_OUTSIDE
    values = {(p, o): v for p, o, v, _ in rows}
    assert all(values[(0, o)] == f"v{2 * o}" for o in range(10, 30))
    # Row ids: distinct; kept by every row outside the range, new inside it.
    row_ids = {(p, o): r for p, o, _, r in rows}
    assert None not in row_ids.values() and len(set(row_ids.values())) == len(row_ids)
    inside = {(0, o) for o in range(10, 30)}
    assert {k: row_ids[k] for k in before if k not in inside} == {
        k: v for k, v in before.items() if k not in inside
    }
    # One commit: Delta Spark's DELETE of the range, our files, a txn per partition.
    actions = _log_actions(table, replayed_version)
    (info,) = [a["commitInfo"] for a in actions if "commitInfo" in a]
    assert info["operation"] == "WRITE" and info["operationParameters"]["mode"] == "Overwrite"
    assert "`offset` BETWEEN 10 AND 29" in info["operationParameters"]["predicate"]
    assert info["inCommitTimestamp"] > 0 and not info["isBlindAppend"]
    # Partition 0's txn is written (a rival of it conflicts) and never moves back.
    # and the rewrite guard's txn, so a delta-rs compaction racing the cut conflicts.
    txns = {a["txn"]["appId"]: a["txn"]["version"] for a in actions if "txn" in a}
    assert txns.pop(REWRITE_GUARD) >= 0 and list(txns.values()) == [COUNT // 2 - 1]
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    added = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
    assert removed
    if case == "deletion-vectors":  # the range's rows marked deleted: no file rewritten
        assert all(added[path].get("deletionVector") for path in removed), actions
    else:  # rewritten without the range's rows, under new names
        assert not removed & set(added) and not any(a.get("deletionVector") for a in added.values())
    assert DeltaTable(str(table)).version() == replayed_version
    for version in range(replayed_version + 1):
        spark_rows(spark, table, "id", versionAsOf=version)  # every version reads
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]
    assert detail.clusteringColumns == ["id"]

    # The change feed of the replay: the range's old rows deleted, the topic's inserted, no
    # other row (read from vectors and files, or from the change data files alone).
    changes = _changes(spark, table, replayed_version, "_change_type, partition, offset")
    assert sorted(changes) == sorted(
        [("delete", p, o) for p, o in inside - DELETED_INSIDE]
        + [("insert", p, o) for p, o in inside]
    )
    change_files = [a for a in actions if "cdc" in a]
    assert bool(change_files) == (case == "rewrite"), change_files
    if case == "deletion-vectors":
        # Spark's widened and VARIANT values as they were.
        filled = spark.sql(
            f"SELECT id, n, to_json(doc) FROM delta.`{table}` WHERE n IS NOT NULL "
            "OR doc IS NOT NULL"
        ).collect()
        assert sorted(tuple(r) for r in filled) == [(i, i, '{"a":1}') for i in sorted(SPARK_IDS)]
    spark.sql(f"INSERT INTO delta.`{table}` (id, v) VALUES (5000, 'after')")
    assert len(spark_rows(spark, table, "id")) == len(held) + 1


def _changes(spark: Any, table: Path, version: int, columns: str) -> list[tuple[Any, ...]]:
    """The change feed of ``version`` as Spark reads it, ``columns`` of each change."""
    frame = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(str(table))
    )
    return [tuple(r) for r in frame.selectExpr(*columns.split(", ")).collect()]


def _replay(
    broker: KafkaCluster, spark: Any, tmp_path: Path, topic: str, table: Path, group: str
) -> Any:
    """``ingest replay --overwrite --from 10 --to 30 --partitions 0`` as ``group`` (whose
    app ids the txns are), on the session."""
    path = write_config(
        tmp_path / "replay.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=table,
        sections={
            "table.value": {"format": "json", "schema": VALUE_SCHEMA},
            "maintenance": {"enabled": False},
        },
    )
    return replay_run(
        config(path),
        start=parse_position("10", "--from"),
        end=parse_position("30", "--to"),
        partitions=[0],
        overwrite=True,
        spark=spark,
    ).run()


def test_an_overwrite_delta_spark_writes_checks_and_fills_the_rows(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    """A table with a generated column (`id2` = id * 2), a CHECK constraint and an identity
    column: the replay's rows are written by Delta Spark's writer in the cut's transaction
    (before, an overwrite committed ingest's own files there: `id2` and `n` null, the
    constraint unchecked). A row that breaks the constraint is a dead letter once, in the
    dead-letter table's range, and never committed."""
    topic = unique_name("t-overwrite-rows")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, topic_records())
    table = tmp_path / "table"
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in spark_schema().fields)
    spark.sql(
        f"CREATE TABLE delta.`{table}` (n BIGINT GENERATED ALWAYS AS IDENTITY, {columns}, "
        "id2 BIGINT GENERATED ALWAYS AS (id * 2)) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    constraint = "id < 30"
    spark.sql(f"ALTER TABLE delta.`{table}` ADD CONSTRAINT c CHECK ({constraint})")
    breaking = sorted(
        (n % 2, n // 2, f"violates the table's CHECK constraint c ({constraint})")
        for n in range(COUNT)
        if n % IDS >= 30
    )
    group = unique_name("g-overwrite")
    outcome = run(
        spark, tmp_path, bootstrap=broker.bootstrap, topic=topic, table=table, group=group
    )
    assert outcome.exit_code == 0, outcome.message
    spark.sql(f"DELETE FROM delta.`{table}` WHERE `partition` = 0 AND `offset` IN (12, 13)")
    kept = {(n % 2, n // 2): n for n in range(COUNT) if n % IDS < 30}
    before = spark_rows(spark, table, "partition, offset, n")
    version = DeltaTable(str(table)).version() + 1

    replayed = _replay(broker, spark, tmp_path, topic, table, group)
    assert replayed.exit_code == 0, replayed.message
    rows = spark_rows(spark, table, "partition, offset, id, v, id2, n")
    assert [(p, o) for p, o, *_ in rows] == sorted(kept)  # 12 and 13 back, nothing twice
    assert all(i == kept[(p, o)] % IDS and v == f"v{kept[(p, o)]}" for p, o, i, v, _, _ in rows)
    assert all(id2 == 2 * i for _, _, i, _, id2, _ in rows)
    numbers = [n for *_, n in rows]
    assert None not in numbers and len(set(numbers)) == len(numbers)
    outside = {(p, o): n for p, o, n in before if not (p == 0 and 10 <= o < 30)}
    assert {(p, o): n for p, o, *_, n in rows if (p, o) in outside} == outside
    assert _dead_letters(table) == breaking
    (info,) = [a["commitInfo"] for a in _log_actions(table, version) if "commitInfo" in a]
    assert info["operationParameters"]["mode"] == "Overwrite"
    assert DeltaTable(str(table)).version() == version
    # The change feed (change data files: the DELETE rewrote files): each replayed row
    # inserted with the identity value and `id2` the table holds, the old rows deleted.
    changes = _changes(spark, table, version, "_change_type, partition, offset, id2, n")
    held = {(p, o): (id2, n) for p, o, _, _, id2, n in rows if p == 0 and 10 <= o < 30}
    old_rows = {(p, o): n for p, o, n in before if p == 0 and 10 <= o < 30}
    assert sorted(changes) == sorted(
        [("insert", p, o, *held[(p, o)]) for p, o in held]
        + [("delete", p, o, 2 * (kept[(p, o)] % IDS), n) for (p, o), n in old_rows.items()]
    )


@pytest.mark.parametrize("feature", ["deletionVectors", "changeDataFeed"])
def test_ingest_replay_overwrite_cuts_such_a_table_on_spark(
    broker: KafkaCluster, spark: Any, tmp_path: Path, feature: str
) -> None:
    """The command, with default settings, on a table whose only feature is deletion
    vectors, or a change feed: its appends ran on the local engine; `ingest replay
    --overwrite` picks Spark for the cut, and the range is the topic's again, once (and the
    feed says so, no more)."""
    topic = unique_name("t-overwrite-cli")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, topic_records())
    table = tmp_path / "table"
    key = {"deletionVectors": "enableDeletionVectors", "changeDataFeed": "enableChangeDataFeed"}
    create_spark_table(spark, table, properties={f"delta.{key[feature]}": "true"})
    path = write_config(
        tmp_path / "cli.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g-overwrite-cli"),
        table=table,
        sections={"table.value": {"format": "json", "schema": VALUE_SCHEMA}},
    )
    first = Cli(["run", "--until-end", "--config", str(path)], tmp_path / "run.log")
    assert first.wait(RUN_TIMEOUT) == 0, first.text()[-4000:]
    assert "batches run on the local engine" in first.text()
    spark.sql(f"DELETE FROM delta.`{table}` WHERE {_where(DELETED_INSIDE | DELETED_OUTSIDE)}")
    version = DeltaTable(str(table)).version() + 1

    args = ["replay", "--from", "10", "--to", "30", "--partitions", "0", "--overwrite"]
    replay = Cli([*args, "--config", str(path)], tmp_path / "replay.log")
    assert replay.wait(RUN_TIMEOUT) == 0, replay.text()[-4000:]
    assert "batches run on the local engine" not in replay.text()
    cut = 20 - len(DELETED_INSIDE)  # the range's rows the table still held
    assert f"Delta Spark's DELETE took {cut} rows out of the range" in replay.text()
    held = [(p, o) for p, o in spark_rows(spark, table, "partition, offset")]
    every = {(n % 2, n // 2) for n in range(COUNT)}
    assert len(held) == len(set(held))
    assert set(held) == {(-1, i) for i in SPARK_IDS} | every - DELETED_OUTSIDE
    if feature == "changeDataFeed":
        inside = {(0, o) for o in range(10, 30)}
        assert sorted(_changes(spark, table, version, "_change_type, partition, offset")) == sorted(
            [("delete", p, o) for p, o in inside - DELETED_INSIDE]
            + [("insert", p, o) for p, o in inside]
        )
