"""Type widening (table feature ``typeWidening``) with Delta Spark as the other party.

Spark makes the table, fills narrow columns (SMALLINT, FLOAT) in its own rows and widens
them (to INT, DOUBLE): its old files keep the narrow types, the table's schema says the wide
ones. delta-rs 1.6.6 loads such a table's log but neither writes to it nor reads its rows,
so ingest commits its appends through Delta Spark's transaction and upserts with Delta
Spark's MERGE (``ingest.sink.metadata.features``). Each value must be the one produced,
in the wider type, at every version; a later widening takes effect at the next run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.delta.interop_support import SPARK_IDS, create_spark_table, run, spark_rows

pytestmark = pytest.mark.spark

FIRST = 30  # records before the second widening: n beyond SMALLINT, f a DOUBLE
LATER = 10  # records after it: n beyond INT
SCHEMA = "id BIGINT, v STRING, n {n}, f DOUBLE"


def _record(k: int) -> tuple[int, str, int, float]:
    """(id, v, n, f) of the topic's record k (ids 0-19: an upsert updates Spark's 0-4)."""
    n = 100_000 + k if k < FIRST else 2**40 + k
    return k % 20, f"v{k}", n, k + 0.1


def _produce(bootstrap: str, topic: str, ks: range) -> None:
    produce(
        bootstrap,
        topic,
        [
            ProducedRecord(
                json.dumps(dict(zip(("id", "v", "n", "f"), _record(k), strict=True))).encode()
            )
            for k in ks
        ],
    )


def _widened_table(spark: Any, table: Path) -> None:
    """Spark's table: ingest's columns plus n SMALLINT and f FLOAT, filled in Spark's rows
    (written narrow), then widened to INT and DOUBLE."""
    create_spark_table(spark, table, properties={"delta.enableTypeWidening": "true"})
    spark.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (n SMALLINT, f FLOAT)")
    spark.sql(f"UPDATE delta.`{table}` SET n = CAST(id AS SMALLINT), f = CAST(id + 0.5 AS FLOAT)")
    spark.sql(f"ALTER TABLE delta.`{table}` CHANGE COLUMN n TYPE INT")
    spark.sql(f"ALTER TABLE delta.`{table}` CHANGE COLUMN f TYPE DOUBLE")
    assert "typeWidening" in (DeltaTable(str(table)).protocol().reader_features or [])


def _expected(records: list[tuple[int, str, int, float]], mode: str) -> list[Any]:
    spark_rows_ = [(i, f"spark{i}", i, i + 0.5) for i in SPARK_IDS]
    if mode == "append":
        return sorted(spark_rows_ + records)
    latest = {row[0]: row for row in spark_rows_}
    latest.update({row[0]: row for row in records})  # one partition: the last record wins
    return sorted(latest.values())


def _history(spark: Any, table: Path) -> list[tuple[int, str]]:
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    return sorted((row.version, row.operation) for row in rows)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_type_widening(broker: KafkaCluster, spark: Any, tmp_path: Path, mode: str) -> None:
    topic, group = unique_name("t-widen"), unique_name("g-widen")
    create_topic(broker.bootstrap, topic, partitions=1)
    table = tmp_path / "table"
    _widened_table(spark, table)
    before = DeltaTable(str(table)).version()

    def ingest(n_type: str) -> None:
        schema = {
            "table.value": {"format": "json", "schema": SCHEMA.format(n=n_type)},
            "maintenance": {"enabled": True},  # the default (no pass is due in a short run)
        }
        outcome = run(
            spark,
            tmp_path,
            bootstrap=broker.bootstrap,
            topic=topic,
            table=table,
            group=group,
            mode=mode,
            sections=schema,
        )
        assert outcome.exit_code == 0, outcome.message

    _produce(broker.bootstrap, topic, range(FIRST))
    ingest("INT")
    first = [_record(k) for k in range(FIRST)]
    assert spark_rows(spark, table, "id, v, n, f") == _expected(first, mode)
    ours = DeltaTable(str(table)).version()
    assert ours > before

    # A later widening (INT to BIGINT) and values that need it, at the next run.
    spark.sql(f"ALTER TABLE delta.`{table}` CHANGE COLUMN n TYPE BIGINT")
    _produce(broker.bootstrap, topic, range(FIRST, FIRST + LATER))
    ingest("BIGINT")
    every = [_record(k) for k in range(FIRST + LATER)]
    assert spark_rows(spark, table, "id, v, n, f") == _expected(every, mode)

    # Every version reads, and the one before our first run holds only Spark's rows.
    latest = DeltaTable(str(table)).version()
    for version in range(latest + 1):
        spark_rows(spark, table, "id", versionAsOf=version)
    assert spark_rows(spark, table, "id, v, n, f", versionAsOf=before) == _expected([], mode)
    assert spark_rows(spark, table, "id, v, n, f", versionAsOf=ours) == _expected(first, mode)
    history = _history(spark, table)
    assert [v for v, _ in history] == list(range(latest + 1)), history
    ours_ops = {op for v, op in history if v > before and op != "CHANGE COLUMN"}
    assert ours_ops == ({"WRITE"} if mode == "append" else {"MERGE"}), history
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]
    assert "typeWidening" in detail.tableFeatures and detail.numFiles > 0
    fields = {f["name"]: f for f in json.loads(DeltaTable(str(table)).schema().to_json())["fields"]}
    assert (fields["n"]["type"], fields["f"]["type"]) == ("long", "double")

    # Spark writes after us, in the widest type.
    spark.sql(f"INSERT INTO delta.`{table}` (id, v, n, f) VALUES (9000, 'after', {2**50}, 0.25)")
    assert spark_rows(spark, table, "id, v, n, f") == sorted(
        [*_expected(every, mode), (9000, "after", 2**50, 0.25)]
    )
