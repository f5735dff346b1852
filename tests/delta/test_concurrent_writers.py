"""Delta Spark's DELETE, UPDATE and MERGE beside ``ingest run``'s continuous appends, on a table
partitioned by day (a ``table.transform`` adds the record's UTC day; ``table.partition_by``):
each DML restricted to a past day commits at its first attempt while ingest appends today's
rows, and commits over appends that landed while it ran.

Delta Spark 4.4 OSS commits DML under Serializable only (test_spark_dml.py): an added file
conflicts when it matches the DML's read predicates, and the conflict checker matches them on
partition values (``ConflictChecker.checkForAddedFilesThatShouldHaveBeenReadByCurrentTxn``).
Today's appended files never match ``day = <a past day>``. A DML whose predicate reaches
today's partition, or an unpartitioned table, conflicts with every append that lands while it
runs, Spark's own as ours (docs/delta-compat.md, "Concurrent writers").

OPTIMIZE (no data change: SnapshotIsolation) and ALTER TABLE ADD COLUMNS commit beside the
appends too; ingest's next commit rebases over them, or, when its snapshot's metadata changed,
loses the race and retries.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.protocol.partition import Partition
from ingest.sink.txn import app_id
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.runtime.support import (
    InProcess,
    broker_ends,
    config,
    group_offsets,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.spark

OLD_DAY = "2026-01-01"
OLD_MS = int(datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp() * 1000)
OLD = 200  # records n < OLD carry OLD_DAY's timestamp; n % 2 is the partition, n // 2 the offset
ROUNDS = 5  # each DML runs at most this often, until one ran over a concurrent append
PAST = f"day = DATE '{OLD_DAY}'"


def _records(start: int, count: int, timestamp_ms: int | None) -> list[ProducedRecord]:
    return [
        ProducedRecord(json.dumps({"n": n}).encode(), partition=n % 2, timestamp_ms=timestamp_ms)
        for n in range(start, start + count)
    ]


def _statement(table: Path, dml: str, residue: int) -> str:
    """The DML of one round: it touches the past day's rows with ``n % 20 == residue``."""
    target = f"delta.`{table}`"
    if dml == "delete":
        return f"DELETE FROM {target} WHERE {PAST} AND n % 20 = {residue}"
    if dml == "update":
        return f"UPDATE {target} SET n = n + 100000 WHERE {PAST} AND n % 20 = {residue}"
    source = f"SELECT id AS n FROM range({OLD}) WHERE id % 20 = {residue}"
    return (
        f"MERGE INTO {target} t USING ({source}) s ON t.{PAST} AND t.n = s.n "
        f"WHEN MATCHED THEN UPDATE SET t.n = s.n + 200000"
    )


def _last_commit(spark: Any, table: Path, operation: str) -> tuple[int, int]:
    """(version, readVersion) of the newest commit of ``operation`` (ingest's appends may
    have landed after it)."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 50").collect()
    row = next(r for r in history if r.operation == operation)
    return int(row.version), int(row.readVersion)


# Bounded waits of 120-180 s each; a timeout's signal would break the session's Spark.
@pytest.mark.timeout(900)
def test_spark_dml_optimize_and_alter_commit_first_try_while_ingest_appends(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    topic, table = unique_name("t-dml"), tmp_path / "events"
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, _records(0, OLD, OLD_MS))
    cfg = config(
        write_config(
            tmp_path / "run.toml",
            bootstrap=broker.bootstrap,
            topic=topic,
            group=unique_name("g-dml"),
            table=table,
            sections={
                "table": {
                    "transform": "SELECT *, to_date(timestamp) AS day FROM batch",
                    "partition_by": ["day"],
                },
                "table.value": {"format": "json", "schema": "n BIGINT"},
                "maintenance": {"enabled": False},
            },
        )
    )
    apps = {p: app_id(str(table), cfg.source.group_id, topic, p) for p in (0, 1)}

    def landed(partition: int, offset: int) -> bool:
        try:
            version = DeltaTable(str(table)).transaction_version(apps[partition])
        except Exception:
            return False
        return version is not None and version >= offset

    enough = threading.Event()
    produced = [OLD]

    def producer() -> None:  # today's records every 0.25 s until the DMLs are done
        while not enough.is_set():
            produce(broker.bootstrap, topic, _records(produced[0], 20, None))
            produced[0] += 20
            time.sleep(0.25)

    feeding = threading.Thread(target=producer, name="test-producer", daemon=True)
    run = InProcess(group_run(cfg, spark=spark))
    feeding.start()
    # dml -> [(residue, version, readVersion)] of its commits; every statement must commit
    # at its first attempt (an exception fails the test).
    commits: dict[str, list[tuple[int, int, int]]] = {"delete": [], "update": [], "merge": []}
    try:
        wait_until(lambda: landed(0, OLD // 2 + 20) and landed(1, OLD // 2 + 20), 120, "rows")
        spark.sql(f"OPTIMIZE delta.`{table}`")
        for base, dml in ((0, "delete"), (6, "update"), (12, "merge")):
            for residue in range(base, base + ROUNDS):
                done = len(commits[dml])
                spark.sql(_statement(table, dml, residue))
                version, read = _last_commit(spark, table, dml.upper())
                assert done == 0 or version > commits[dml][-1][1], (dml, version)
                commits[dml].append((residue, version, read))
                if version > read + 1:  # an append landed while it ran, and it still won
                    break
        spark.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (note STRING)")
        altered = DeltaTable(str(table)).version()
        wait_until(lambda: DeltaTable(str(table)).version() > altered + 1, 120, "more appends")
        enough.set()
        feeding.join(60)
        partitions = [Partition(topic, p) for p in (0, 1)]
        ends = broker_ends(cfg, partitions)
        wait_until(
            lambda: group_offsets(cfg, partitions) == ends, 180, "offsets committed to the end"
        )
    finally:
        enough.set()
        outcome = run.stop()
    assert outcome.exit_code == 0, outcome.message
    print(f"commits (residue, version, readVersion): {commits}")
    for dml, made in commits.items():
        assert made[-1][1] > made[-1][2] + 1, f"{dml} never ran over a concurrent append: {made}"

    touched = {dml: {residue for residue, _, _ in made} for dml, made in commits.items()}
    expected = set()
    for n in range(produced[0]):
        residue = n % 20
        if n < OLD and residue in touched["delete"]:
            continue
        if n < OLD and residue in touched["update"]:
            expected.add((n % 2, n // 2, n + 100000))
        elif n < OLD and residue in touched["merge"]:
            expected.add((n % 2, n // 2, n + 200000))
        else:
            expected.add((n % 2, n // 2, n))
    frame = spark.read.format("delta").load(str(table))
    rows = [
        (r.partition, r.offset, r.n) for r in frame.select("partition", "offset", "n").collect()
    ]
    assert len(rows) == len(set(rows)), "a row landed twice"
    assert set(rows) == expected
    days = {str(r.day) for r in frame.select("day").distinct().collect()}
    assert OLD_DAY in days and len(days) >= 2, days
    assert frame.where("note IS NOT NULL").count() == 0
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    operations = {r.operation for r in history}
    assert {"OPTIMIZE", "DELETE", "UPDATE", "MERGE", "ADD COLUMNS", "WRITE"} <= operations
    # ingest wrote after the ALTER (its schema now has the column).
    assert max(r.version for r in history if r.operation == "WRITE") > altered
