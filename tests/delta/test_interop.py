"""Delta Spark as the other party: tables it created as targets of ``ingest run`` (append and
upsert), per table feature, either written correctly (Spark reads exactly the expected rows)
or refused before anything is written, with a message naming the feature
(``ingest.sink.metadata.features``; docs/delta-compat.md).

One topic for the module (``interop_support``); each case is its own table and group, and
each run is a short ``--until-end`` run on the session's Spark.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ingest.sink.maintenance.compact import compact, live_files, vector_paths
from ingest.sink.metadata.features import UnsupportedTableFeature, check_table
from ingest.sink.storage import TableLocation
from ingest.supervisor.engine.maintainer import check_tables
from ingest.supervisor.modes.replay import parse_position, replay_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.delta.interop_support import (
    COUNT,
    IDS,
    SPARK_IDS,
    VALUE_SCHEMA,
    appended_rows,
    create_spark_table,
    data_files,
    run,
    spark_rows,
    spark_schema,
    topic_records,
    upserted_rows,
)
from tests.runtime.support import config, write_config

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def topic(broker: KafkaCluster) -> Iterator[str]:
    name = unique_name("t-interop")
    create_topic(broker.bootstrap, name, partitions=2)
    produce(broker.bootstrap, name, topic_records())
    yield name


def _run(spark: Any, tmp_path: Path, broker: KafkaCluster, topic: str, table: Path, **kw: Any):
    return run(
        spark,
        tmp_path,
        bootstrap=broker.bootstrap,
        topic=topic,
        table=table,
        group=unique_name("g-interop"),
        **kw,
    )


def _refused(outcome: Any, table: Path, before: set[str], *names: str) -> None:
    """The run failed, its message names each feature, and the table is as it was."""
    assert outcome.exit_code == 1, outcome.message
    for name in names:
        assert f"table feature '{name}'" in outcome.message, outcome.message
    assert data_files(table) == before, "the refused run wrote files"


@pytest.mark.quick
def test_default_features_partitioned_append_and_upsert(
    broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path
) -> None:
    appended, upserted = tmp_path / "append", tmp_path / "upsert"
    create_spark_table(spark, appended, partitioned=True)
    create_spark_table(spark, upserted)
    assert DeltaTable(str(appended)).protocol()[:2] == (1, 2)  # Delta Spark's defaults

    outcome = _run(
        spark,
        tmp_path,
        broker,
        topic,
        appended,
        sections={"table": {"partition_by": ["partition"]}},
    )
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, appended) == appended_rows()
    by_partition = spark_rows(spark, appended, "partition, offset")
    assert by_partition == sorted(
        [(-1, i) for i in SPARK_IDS] + [(n % 2, n // 2) for n in range(COUNT)]
    )

    outcome = _run(spark, tmp_path, broker, topic, upserted, mode="upsert")
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, upserted) == upserted_rows()


def test_deletion_vectors(broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path) -> None:
    """Spark deletes rows with deletion vectors. An append run with maintenance's defaults
    leaves them deleted; compaction compacts the other files around the one with the
    vector, which stays as it is; an upsert's MERGE, which rewrites the file holding them
    (ids 0-4 are in it), brings none back. delta-rs cannot cut it for an overwrite (its
    remove could not name the vector); Delta Spark's transaction can
    (``test_overwrite_delta_spark.py``)."""
    dv = {"delta.enableDeletionVectors": "true"}
    appended, upserted = tmp_path / "append", tmp_path / "upsert"
    for table in (appended, upserted):
        create_spark_table(spark, table, properties=dv)
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id IN (1001, 1003)")
        history = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
        assert int(history.operationMetrics["numDeletionVectorsAdded"]) == 1
    kept = tuple(i for i in SPARK_IDS if i not in (1001, 1003))

    outcome = _run(
        spark, tmp_path, broker, topic, appended, sections={"maintenance": {"enabled": True}}
    )
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, appended) == appended_rows(kept)
    with_vector = vector_paths(DeltaTable(str(appended)))
    assert len(with_vector) == 1
    # The run's own maintenance may have compacted already; one more pass leaves one file
    # of ours beside Spark's file with its vector.
    compact(TableLocation.of(str(appended)), target_size=64 * 1024**2)
    after = DeltaTable(str(appended))
    assert vector_paths(after) == with_vector
    others = set(live_files(after)) - with_vector
    assert len(others) == 1 and next(iter(others)).startswith("compact-"), others
    assert spark_rows(spark, appended) == appended_rows(kept)
    with pytest.raises(UnsupportedTableFeature, match=r"'deletionVectors'.*RemoveAction"):
        check_table(str(appended), after, "overwrite")
    check_table(str(appended), after, "overwrite", delta_spark=True)

    outcome = _run(spark, tmp_path, broker, topic, upserted, mode="upsert")
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, upserted) == upserted_rows(kept)


# The table's `v` renamed to `text` by Spark: the transform writes the records' `v` there.
_RENAMED = (
    "SELECT topic, `partition`, `offset`, timestamp, timestamp_type, key, headers, id, "
    "v AS text FROM batch"
)


def test_column_mapping(broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path) -> None:
    """Name mode, partitioned, with a column renamed (`v` -> `text`) and one dropped
    (`timestamp_type`, which ingest's rows then add again: a new physical name, so the
    batch is written again after the commit that adds it). Appends, a compaction, an
    overwrite replay of the whole topic and an upsert: Spark reads every row exact and
    every value of the renamed column, and writes after us. Id mode: appends, exact."""
    renamed, upserted, by_id = tmp_path / "renamed", tmp_path / "upsert", tmp_path / "id"
    for table in (renamed, upserted):
        create_spark_table(
            spark, table, properties={"delta.columnMapping.mode": "name"}, partitioned=True
        )
        spark.sql(f"ALTER TABLE delta.`{table}` RENAME COLUMN v TO text")
        spark.sql(f"ALTER TABLE delta.`{table}` DROP COLUMN timestamp_type")
    create_spark_table(spark, by_id, properties={"delta.columnMapping.mode": "id"})
    transform = {"table": {"partition_by": ["partition"], "transform": _RENAMED}}

    outcome = _run(spark, tmp_path, broker, topic, renamed, sections=transform)
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, renamed, "id, text") == appended_rows()
    by_partition = spark_rows(spark, renamed, "partition, offset, timestamp_type")
    assert by_partition == sorted(
        [(-1, i, None) for i in SPARK_IDS] + [(n % 2, n // 2, 0) for n in range(COUNT)]
    )
    fields = {f.name: f for f in DeltaTable(str(renamed)).schema().fields}
    assert fields["text"].metadata["delta.columnMapping.physicalName"] != "text"

    before = len(live_files(DeltaTable(str(renamed))))
    done = compact(TableLocation.of(str(renamed)), target_size=64 * 1024**2)
    assert done.files_removed > 0 and len(live_files(DeltaTable(str(renamed)))) < before
    assert spark_rows(spark, renamed, "id, text") == appended_rows()

    group = unique_name("g-interop")
    replayed = replay_run(
        config(
            write_config(
                tmp_path / "replay.toml",
                bootstrap=broker.bootstrap,
                topic=topic,
                group=group,
                table=renamed,
                sections={
                    **transform,
                    "table.value": {"format": "json", "schema": VALUE_SCHEMA},
                    "maintenance": {"enabled": False},
                },
            )
        ),
        start=parse_position("earliest", "--from"),
        overwrite=True,
        spark=spark,
    ).run()
    assert replayed.exit_code == 0, replayed.message
    assert spark_rows(spark, renamed, "id, text") == appended_rows()

    spark.sql(f"INSERT INTO delta.`{renamed}` (id, text) VALUES (5000, 'after')")
    assert spark_rows(spark, renamed, "id, text") == sorted([*appended_rows(), (5000, "after")])
    history = spark.sql(f"DESCRIBE HISTORY delta.`{renamed}`").collect()
    assert [h.version for h in history] == list(range(len(history) - 1, -1, -1))
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{renamed}`").collect()[0]
    assert detail.partitionColumns == ["partition"]

    upsert = {
        "table": {
            "partition_by": ["partition"],
            "transform": _RENAMED.replace("timestamp_type, ", ""),
            "tombstones": "ignore",
        }
    }
    outcome = _run(spark, tmp_path, broker, topic, upserted, mode="upsert", sections=upsert)
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, upserted, "id, text") == upserted_rows()

    outcome = _run(spark, tmp_path, broker, topic, by_id)
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, by_id) == appended_rows()
    assert spark_rows(spark, by_id, "count(*)") == [(len(appended_rows()),)]


# What a managed platform's table may carry at once: deletion vectors, column mapping, row
# tracking, in-commit timestamps, clustering (with domain metadata), v2 checkpoints (one
# after every commit, so that delta-rs's loads read them) and vacuumProtocolCheck.
_PLATFORM = {
    "delta.enableDeletionVectors": "true",
    "delta.columnMapping.mode": "name",
    "delta.enableRowTracking": "true",
    "delta.enableInCommitTimestamps": "true",
    "delta.checkpointPolicy": "v2",
    "delta.checkpointInterval": "1",
    "delta.feature.vacuumProtocolCheck": "supported",
}


def _commit_infos(table: Path) -> dict[int, dict[str, Any]]:
    infos = {}
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                infos[int(entry.stem)] = action["commitInfo"]
    return infos


def test_delta_spark_features(broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path) -> None:
    """A table as a platform makes it (``_PLATFORM``, clustered by id, `v` renamed to `text`,
    `timestamp_type` dropped, rows deleted with a deletion vector) takes ``ingest run`` appends
    through Delta Spark's transaction: the transform's `timestamp_type` comes back through
    Delta Spark's ALTER, Spark reads every row and every value of `text` exact at every
    version, each row has its own row id, each commit its in-commit timestamp, the clustering
    stays, delta-rs reads the v2 checkpoints, and Spark writes after us."""
    table, upserted = tmp_path / "platform", tmp_path / "upsert"
    for made in (table, upserted):
        create_spark_table(spark, made, properties=_PLATFORM, cluster_by="id")
        spark.sql(f"ALTER TABLE delta.`{made}` RENAME COLUMN v TO text")
        spark.sql(f"ALTER TABLE delta.`{made}` DROP COLUMN timestamp_type")
        spark.sql(f"DELETE FROM delta.`{made}` WHERE id IN (1001, 1003)")
    kept = tuple(i for i in SPARK_IDS if i not in (1001, 1003))
    first = DeltaTable(str(table)).version() + 1
    features = DeltaTable(str(table)).protocol().writer_features or []
    for feature in ("rowTracking", "domainMetadata", "clustering", "inCommitTimestamp"):
        assert feature in features, features

    outcome = _run(
        spark,
        tmp_path,
        broker,
        topic,
        table,
        sections={"table": {"transform": _RENAMED}, "maintenance": {"enabled": True}},
    )
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, table, "id, text") == appended_rows(kept)
    by_offset = spark_rows(spark, table, "partition, offset, timestamp_type")
    assert by_offset == sorted(
        [(-1, i, None) for i in kept] + [(n % 2, n // 2, 0) for n in range(COUNT)]
    )
    row_ids = spark_rows(spark, table, "_metadata.row_id, _metadata.row_commit_version")
    assert len({r for r, _ in row_ids}) == len(row_ids) and None not in {r for r, _ in row_ids}
    latest = DeltaTable(str(table)).version()
    assert {v for _, v in row_ids} - set(range(latest + 1)) == set()
    infos = _commit_infos(table)
    ours = [v for v in range(first, latest + 1) if infos[v]["operation"] == "WRITE"]
    assert ours, infos
    for version in ours:
        assert infos[version]["inCommitTimestamp"] > 0 and infos[version]["isBlindAppend"]
    for version in range(first, latest + 1):  # every version reads what it held
        assert len(spark_rows(spark, table, "id", versionAsOf=version)) >= len(kept)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]
    assert detail.clusteringColumns == ["id"]
    # Delta Spark's post-commit hook wrote a v2 checkpoint (a JSON manifest and sidecars)
    # after our commit; delta-rs loads the table from it.
    assert list((table / "_delta_log").glob(f"{latest:020d}.checkpoint.*.json"))
    assert list((table / "_delta_log" / "_sidecars").iterdir())
    assert DeltaTable(str(table)).version() == latest

    spark.sql(f"INSERT INTO delta.`{table}` (id, text) VALUES (5000, 'after')")
    spark.sql(f"OPTIMIZE delta.`{table}`")
    assert spark_rows(spark, table, "id, text") == sorted([*appended_rows(kept), (5000, "after")])

    # Upsert: one Delta Spark MERGE per partition, each carrying its partition's txn.
    upsert = {"table": {"transform": _RENAMED, "tombstones": "ignore"}}
    outcome = _run(spark, tmp_path, broker, topic, upserted, mode="upsert", sections=upsert)
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, upserted, "id, text") == upserted_rows(kept)
    merges = [i for i in _commit_infos(upserted).values() if i["operation"] == "MERGE"]
    assert len(merges) == 2 and all(i["inCommitTimestamp"] > 0 for i in merges)
    row_ids = spark_rows(spark, upserted, "_metadata.row_id")
    assert len(set(row_ids)) == len(row_ids) == len(upserted_rows(kept))
    again = _run(spark, tmp_path, broker, topic, upserted, mode="upsert", sections=upsert)
    assert again.exit_code == 0, again.message  # a new group: every record again, same rows
    assert spark_rows(spark, upserted, "id, text") == upserted_rows(kept)


def _wall_clock(n: int) -> str:
    return f"2026-01-{1 + n % 3:02d}T{n % 24:02d}:30:00"


def test_timestamp_ntz(broker: KafkaCluster, spark: Any, tmp_path: Path) -> None:
    """Spark adds a TIMESTAMP_NTZ column (table feature ``timestampNtz``); ingest appends and
    upserts values into it, and Spark reads each record's wall-clock time as it was sent."""
    name = unique_name("t-ntz")
    create_topic(broker.bootstrap, name, partitions=1)
    produce(
        broker.bootstrap,
        name,
        [
            ProducedRecord(json.dumps({"id": n % 10, "v": f"v{n}", "at": _wall_clock(n)}).encode())
            for n in range(30)
        ],
    )
    schema = {"table.value": {"format": "json", "schema": "id BIGINT, v STRING, at TIMESTAMP_NTZ"}}
    for mode in ("append", "upsert"):
        table = tmp_path / mode
        create_spark_table(spark, table)
        # As Spark asks: the feature first, then the column.
        spark.sql(
            f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES "
            "('delta.feature.timestampNtz' = 'supported')"
        )
        spark.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (at TIMESTAMP_NTZ)")
        assert "timestampNtz" in (DeltaTable(str(table)).protocol().writer_features or [])
        outcome = _run(spark, tmp_path, broker, name, table, mode=mode, sections=schema)
        assert outcome.exit_code == 0, outcome.message
        records = [(n % 10, f"v{n}", datetime.fromisoformat(_wall_clock(n))) for n in range(30)]
        if mode == "upsert":
            latest = {i: (i, v, at) for i, v, at in records}
            records = list(latest.values())
            ours = {i for i, _, _ in records}
            spark_rows_kept = [(i, f"spark{i}", None) for i in SPARK_IDS if i not in ours]
        else:
            spark_rows_kept = [(i, f"spark{i}", None) for i in SPARK_IDS]
        expected = sorted(records + spark_rows_kept, key=repr)
        assert sorted(spark_rows(spark, table, "id, v, at"), key=repr) == expected


def test_variant_type(broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path) -> None:
    """Spark adds a VARIANT column (table feature ``variantType``) and fills it in its own
    rows; ingest appends and upserts (through Delta Spark: delta-rs does not write such a
    table), its rows leaving the column null, and Spark's variants stay as they were."""
    for mode in ("append", "upsert"):
        table = tmp_path / mode
        create_spark_table(spark, table)
        spark.sql(
            f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.feature.variantType' = "
            "'supported')"
        )
        spark.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (doc VARIANT)")
        spark.sql(f"UPDATE delta.`{table}` SET doc = parse_json(to_json(named_struct('n', id)))")
        assert "variantType" in (DeltaTable(str(table)).protocol().writer_features or [])
        outcome = _run(spark, tmp_path, broker, topic, table, mode=mode)
        assert outcome.exit_code == 0, outcome.message
        rows = spark_rows(spark, table, "id, v, to_json(doc)")
        expected = appended_rows() if mode == "append" else upserted_rows()
        assert [(i, v) for i, v, _ in rows] == expected
        # Spark's rows keep their variants; an upsert that updates one of them changes only
        # the columns the batch has (MERGE's UPDATE SET *): the VARIANT stays.
        docs = {(i, v): doc for i, v, doc in rows}
        for i, v in expected:
            kept = v.startswith("spark") or (mode == "upsert" and i in SPARK_IDS)
            assert docs[(i, v)] == (f'{{"n":{i}}}' if kept else None), (i, v)
        spark.sql(f"INSERT INTO delta.`{table}` (id, v, doc) VALUES (7, 'after', parse_json('1'))")
        assert spark_rows(spark, table, "count(*)") == [(len(expected) + 1,)]


def test_change_data_feed(broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path) -> None:
    """Appends: Spark's change feed shows every record as an insert. Upserts: the MERGE
    writes the update pre/post images of Spark's colliding rows and the inserts."""
    cdf = {"delta.enableChangeDataFeed": "true"}
    appended, upserted = tmp_path / "append", tmp_path / "upsert"
    create_spark_table(spark, appended, properties=cdf)
    create_spark_table(spark, upserted, properties=cdf)

    def changes(table: Path, since: int) -> list[Any]:
        return sorted(
            tuple(row)
            for row in spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", since)
            .load(str(table))
            .select("id", "v", "_change_type")
            .collect()
        )

    since = DeltaTable(str(appended)).version() + 1
    assert _run(spark, tmp_path, broker, topic, appended).exit_code == 0
    assert changes(appended, since) == sorted((n % 40, f"v{n}", "insert") for n in range(COUNT))

    since = DeltaTable(str(upserted)).version() + 1
    outcome = _run(spark, tmp_path, broker, topic, upserted, mode="upsert")
    assert outcome.exit_code == 0, outcome.message
    latest = dict(upserted_rows(()))
    expected = [(i, f"spark{i}", "update_preimage") for i in SPARK_IDS if i in latest]
    expected += [(i, latest[i], "update_postimage") for i in SPARK_IDS if i in latest]
    expected += [(i, v, "insert") for i, v in latest.items() if i not in SPARK_IDS]
    assert changes(upserted, since) == sorted(expected)


def _dead_letters(table: Path) -> list[tuple[Any, ...]]:
    rows = DeltaTable(f"{table}_dead_letters").to_pyarrow_table().to_pylist()
    return sorted((r["partition"], r["offset"], r["error_message"]) for r in rows)


def test_delta_spark_writes_the_rows(
    broker: KafkaCluster, topic: str, spark: Any, tmp_path: Path
) -> None:
    """Tables whose appends Delta Spark must write: a partitioned one with a generated column
    (`id2` = id * 2), a CHECK constraint and a NOT NULL column, one whose NOT NULL column
    `key` every record leaves null, and one with an identity column. The rows that break a
    constraint become dead letters naming it and are never committed; the others land as
    one insert-only Delta Spark MERGE per Kafka partition with its txn, which computes `id2`
    and assigns identity values. Upserts: a
    delta-rs MERGE computes `id2` and, the breaking rows gone to dead letters first, commits;
    on the identity table a Delta Spark MERGE per partition assigns the inserted rows'."""
    options = {"partitioned": True, "generated": True}
    constraint = "`partition` < 0 OR id < 30"
    appended, upserted = tmp_path / "append", tmp_path / "upsert"
    for table in (appended, upserted):
        create_spark_table(spark, table, constraint=constraint, not_null=("id",), **options)
    partitioned = {"table": {"partition_by": ["partition"]}}
    breaking = sorted(
        (n % 2, n // 2, f"violates the table's CHECK constraint c ({constraint})")
        for n in range(COUNT)
        if n % IDS >= 30
    )

    outcome = _run(spark, tmp_path, broker, topic, appended, sections=partitioned)
    assert outcome.exit_code == 0, outcome.message
    rows = spark_rows(spark, appended, "id, v, id2")
    assert [(i, v) for i, v, _ in rows] == [r for r in appended_rows() if r[0] < 30 or r[0] >= 1000]
    assert all(id2 == 2 * i for i, _, id2 in rows)
    assert _dead_letters(appended) == breaking
    merges = [i for i in _commit_infos(appended).values() if i["operation"] == "MERGE"]
    assert len(merges) == 2, merges  # one insert-only MERGE per Kafka partition
    # Another group: the MERGE joins on (topic, partition, offset), so the offsets the table
    # holds never land twice, whoever lands them.
    again = _run(spark, tmp_path, broker, topic, appended, sections=partitioned)
    assert again.exit_code == 0, again.message
    assert len(spark_rows(spark, appended, "id")) == len(rows)

    keyed = tmp_path / "keyed"  # the records have no Kafka key: each one breaks NOT NULL
    create_spark_table(spark, keyed, not_null=("key",), seed=False)
    outcome = _run(spark, tmp_path, broker, topic, keyed)
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, keyed) == []
    assert _dead_letters(keyed) == sorted(
        (n % 2, n // 2, "violates the table's NOT NULL column key") for n in range(COUNT)
    )

    outcome = _run(spark, tmp_path, broker, topic, upserted, mode="upsert", sections=partitioned)
    assert outcome.exit_code == 0, outcome.message
    rows = spark_rows(spark, upserted, "id, v, id2")
    assert [(i, v) for i, v, _ in rows] == [r for r in upserted_rows() if r[0] < 30 or r[0] >= 1000]
    assert all(id2 == 2 * i for i, _, id2 in rows)
    assert _dead_letters(upserted) == breaking

    identity = tmp_path / "identity"
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in spark_schema().fields)
    spark.sql(
        f"CREATE TABLE delta.`{identity}` (n BIGINT GENERATED ALWAYS AS IDENTITY, {columns}) "
        "USING delta"
    )
    spark.sql(f"INSERT INTO delta.`{identity}` (id, v) VALUES (1000, 'spark1000')")
    outcome = _run(spark, tmp_path, broker, topic, identity)
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, identity) == appended_rows((1000,))
    numbers = spark_rows(spark, identity, "n")
    assert None not in numbers and len(set(numbers)) == len(numbers)
    upsert_identity = tmp_path / "identity-upsert"
    spark.sql(
        f"CREATE TABLE delta.`{upsert_identity}` (n BIGINT GENERATED ALWAYS AS IDENTITY, "
        f"{columns}) USING delta"
    )
    outcome = _run(spark, tmp_path, broker, topic, upsert_identity, mode="upsert")
    assert outcome.exit_code == 0, outcome.message
    assert spark_rows(spark, upsert_identity) == upserted_rows(())
    numbers = spark_rows(spark, upsert_identity, "n")
    assert None not in numbers and len(set(numbers)) == len(numbers) == IDS


def test_a_delta_spark_write_whose_txn_a_rival_reached_commits_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """Delta Spark skips a MERGE (an upsert's, or an insert-only append's) whose txn version
    the table already holds (a rival of the same partition committed first): the committer
    says so (None), so the caller reloads instead of counting a commit that never was."""
    from ingest.engines.spark.delta_commit import DeltaSparkCommitter
    from ingest.sink.txn import MergeClauses

    table = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, v STRING) USING delta")
    committer = DeltaSparkCommitter(spark)
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    inserting = MergeClauses("t.id = s.id", None, None, None, ("id", "v"), ("app", 7))
    done = committer.merge(str(table), rows, inserting)
    assert done is not None and (done.version, done.inserted) == (1, 2)
    assert DeltaTable(str(table)).transaction_version("app") == 7
    assert committer.merge(str(table), rows, inserting) is None
    clauses = dataclasses.replace(inserting, update_when="true", txn=("app", 6))
    assert committer.merge(str(table), rows, clauses) is None
    assert DeltaTable(str(table)).version() == 1
    done = committer.merge(str(table), rows, dataclasses.replace(clauses, txn=("app", 8)))
    assert done is not None and (done.version, done.updated) == (2, 2)
    assert spark_rows(spark, table) == [(1, "a"), (2, "b")]


def test_delta_spark_commits_to_s3_need_a_log_store_that_excludes_a_second_writer(
    spark: Any,
) -> None:
    from ingest.engines.spark.delta_commit import DeltaSparkCommitter
    from ingest.errors import SinkError
    from ingest.sink.txn import MergeClauses

    committer = DeltaSparkCommitter(spark)
    with pytest.raises(SinkError, match="S3SingleDriverLogStore"):
        committer.commit("s3://lake/t", [], {"app": 1}, read_version=0, read_txns={"app": None})
    clauses = MergeClauses("true", None, None, None, ("id",), ("app", 1))
    with pytest.raises(SinkError, match=r"spark\.delta\.logStore\.s3a\.impl"):
        committer.merge("s3a://lake/t", pa.table({"id": [1]}), clauses)


REFUSED = {
    "appendOnly": ("upsert", "id BIGINT, v STRING", "TBLPROPERTIES ('delta.appendOnly' = 'true')"),
}


def test_refusals_name_the_feature(broker: KafkaCluster, spark: Any, tmp_path: Path) -> None:
    """What ``ingest run`` checks at start, before joining or writing: a table Delta
    Spark created with each feature ingest refuses for the mode is refused, naming it."""
    for feature, (mode, columns, clause) in REFUSED.items():
        table = tmp_path / feature
        spark.sql(f"CREATE TABLE delta.`{table}` ({columns}) USING delta {clause}")
        sections: dict[str, Any] = {"table": {"mode": mode}, "maintenance": {"enabled": False}}
        if mode == "upsert":
            sections["table"]["merge_keys"] = ["id"]
        path = write_config(
            tmp_path / f"{feature}.toml",
            bootstrap=broker.bootstrap,
            topic="unused",
            group="unused",
            table=table,
            sections=sections,
        )
        with pytest.raises(UnsupportedTableFeature, match=f"table feature '{feature}'"):
            check_tables(config(path))
    # The same tables in the mode each feature allows pass (appendOnly: appends).
    ok = write_config(
        tmp_path / "ok.toml",
        bootstrap=broker.bootstrap,
        topic="unused",
        group="unused",
        table=tmp_path / "appendOnly",
        sections={"maintenance": {"enabled": False}},
    )
    check_tables(config(ok))
