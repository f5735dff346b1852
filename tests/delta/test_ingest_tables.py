"""Tables written by ingest, with Delta Spark on the other side: Spark reads exact rows at
every version and sees our commits in DESCRIBE HISTORY with their metrics; and Spark
writing at the same time as ``ingest run`` (OPTIMIZE, a DELETE of old rows, ALTER TABLE
ADD COLUMNS) leaves the table exact: every offset from the DELETE's bound on, once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
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


def _records(start: int, count: int) -> list[ProducedRecord]:
    return [
        ProducedRecord(json.dumps({"n": n}).encode(), partition=n % 2)
        for n in range(start, start + count)
    ]


def _config(tmp_path: Path, broker: KafkaCluster, topic: str, table: Path) -> Path:
    return write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g-ingest-tables"),
        table=table,
        sections={
            "table.value": {"format": "json", "schema": "n BIGINT"},
            "maintenance": {"enabled": False},
            # Commits 2 s apart leave Spark's DELETE room between two of them.
            "trigger": {"max_age": "2s"},
        },
    )


def _offsets(frame: Any) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in frame.select("partition", "offset").collect())


def test_spark_reads_every_version_and_our_history(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    topic, table = unique_name("t-ingest-tables"), tmp_path / "events"
    create_topic(broker.bootstrap, topic, partitions=2)
    path = _config(tmp_path, broker, topic, table)
    for start in (0, 100):
        produce(broker.bootstrap, topic, _records(start, 100))
        outcome = group_run(config(path), until_end=True, spark=spark).run()
        assert outcome.exit_code == 0, outcome.message

    latest = spark.read.format("delta").load(str(table))
    assert _offsets(latest) == sorted((n % 2, n // 2) for n in range(200))
    assert sorted(r.n for r in latest.select("n").collect()) == list(range(200))

    history = {row.version: row for row in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()}
    assert sorted(history) == list(range(DeltaTable(str(table)).version() + 1))
    writes = [v for v, row in history.items() if row.operation == "WRITE"]
    assert len(writes) == 2, {v: row.operation for v, row in history.items()}
    rows_by_version: dict[int, int] = {}
    for version in writes:
        metrics = history[version].operationMetrics
        log = table / "_delta_log" / f"{version:020d}.json"
        adds = [json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line]
        assert int(metrics["numFiles"]) == len(adds)
        assert int(metrics["numOutputRows"]) == sum(
            json.loads(a["stats"])["numRecords"] for a in adds
        )
        assert int(metrics["numOutputBytes"]) == sum(a["size"] for a in adds)
        rows_by_version[version] = int(metrics["numOutputRows"])
    assert sum(rows_by_version.values()) == 200

    # Time travel: every version, as Spark reads it, holds what delta-rs reads there and
    # the rows the writes up to it added.
    for version in history:
        frame = spark.read.format("delta").option("versionAsOf", version).load(str(table))
        theirs = DeltaTable(str(table), version=version).to_pyarrow_table(
            columns=["partition", "offset"]
        )
        assert _offsets(frame) == sorted(
            zip(
                theirs.column("partition").to_pylist(),
                theirs.column("offset").to_pylist(),
                strict=True,
            )
        )
        assert frame.count() == sum(n for v, n in rows_by_version.items() if v <= version)


def _retrying(spark: Any, statement: str, conflicts: list[str], attempts: int = 10) -> bool:
    """Runs ``statement``, retrying Delta's concurrent-modification exceptions (Spark's
    side of a conflict, counted in ``conflicts``); whether it committed."""
    for _ in range(attempts):
        try:
            spark.sql(statement)
            return True
        except Exception as exc:
            if "DELTA_CONCURRENT" not in str(exc)[:600]:
                raise
            conflicts.append(f"{statement.split()[0]}: {str(exc)[:300]}")
            time.sleep(0.5)
    return False


# Its waits are bounded themselves (120-180 s each); on a loaded machine the whole took 330 s,
# and a timeout's signal would break the session's shared Spark for the tests after it.
@pytest.mark.timeout(900)
def test_spark_optimizes_deletes_and_alters_while_ingest_appends(
    broker: KafkaCluster, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ingest.sink")
    topic, table = unique_name("t-concurrent"), tmp_path / "events"
    create_topic(broker.bootstrap, topic, partitions=2)
    path = _config(tmp_path, broker, topic, table)
    cfg = config(path)
    apps = {p: app_id(str(table), cfg.source.group_id, topic, p) for p in (0, 1)}
    chunk, bound = 60, 300  # rows of offsets below `bound` are deleted

    def landed(partition: int, offset: int) -> bool:
        try:
            version = DeltaTable(str(table)).transaction_version(apps[partition])
        except Exception:
            return False
        return version is not None and version >= offset

    enough, paused = threading.Event(), threading.Event()
    produced = [0]

    def producer() -> None:  # until Spark is done, then one more chunk
        while not enough.is_set():
            if not paused.is_set():
                produce(broker.bootstrap, topic, _records(produced[0], chunk))
                produced[0] += chunk
            time.sleep(0.25)
        produce(broker.bootstrap, topic, _records(produced[0], chunk))

    def caught_up() -> bool:
        total = produced[0]  # records n < total: n // 2 on partition n % 2
        return landed(0, (total + 1) // 2 - 1) and landed(1, total // 2 - 1)

    feeding = threading.Thread(target=producer, name="test-producer", daemon=True)
    feeding.start()
    run = InProcess(group_run(cfg, spark=spark))
    conflicts: list[str] = []
    delete = f"DELETE FROM delta.`{table}` WHERE `offset` < {bound}"
    try:
        wait_until(lambda: landed(0, 100) and landed(1, 100), 120, "the first batches")
        assert _retrying(spark, f"OPTIMIZE delta.`{table}`", conflicts)
        wait_until(lambda: landed(0, bound) and landed(1, bound), 120, "offsets past the bound")
        # Spark's DELETE reads every file: an append committed while it runs aborts it
        # (DELTA_CONCURRENT_APPEND: Delta Spark commits a DELETE under Serializable, where
        # blind appends conflict too, Spark's own as ours: test_spark_dml.py), a clear
        # refusal on Spark's side. Tried while ingest appends; if every try lost, once more
        # while the run idles (no record to land), then the appends go on.
        deleted = _retrying(spark, delete, conflicts, attempts=3)
        if not deleted:
            paused.set()
            wait_until(caught_up, 120, "ingest idle")
            deleted = _retrying(spark, delete, conflicts, attempts=3)
            paused.clear()
        assert deleted, conflicts[-1]
        version = DeltaTable(str(table)).version()
        wait_until(lambda: DeltaTable(str(table)).version() > version + 1, 120, "more appends")
        assert _retrying(spark, f"ALTER TABLE delta.`{table}` ADD COLUMNS (note STRING)", conflicts)
        altered = DeltaTable(str(table)).version()
        enough.set()
        feeding.join(120)
        partitions = [Partition(topic, p) for p in (0, 1)]
        ends = broker_ends(cfg, partitions)
        wait_until(
            lambda: group_offsets(cfg, partitions) == ends, 180, "offsets committed to the end"
        )
    finally:
        enough.set()
        outcome = run.stop()
    assert outcome.exit_code == 0, outcome.message

    frame = spark.read.format("delta").load(str(table))
    assert "note" in frame.columns
    assert frame.where("note IS NOT NULL").count() == 0
    expected = sorted((p, o) for p in (0, 1) for o in range(bound, ends[Partition(topic, p)]))
    assert _offsets(frame) == expected  # no deleted row back, none twice, none lost
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    operations = {r.operation for r in history}
    assert {"OPTIMIZE", "DELETE", "ADD COLUMNS", "WRITE"} <= operations, operations
    # ingest wrote between Spark's commits and after the ALTER.
    spark_versions = sorted(r.version for r in history if r.operation != "WRITE")
    writes = sorted(r.version for r in history if r.operation == "WRITE")
    assert any(spark_versions[-3] < v < spark_versions[-1] for v in writes), operations
    assert max(writes) > altered
    raced = [r.getMessage() for r in caplog.records if "lost a race" in r.getMessage()]
    print(
        f"Spark's conflicts: {len(conflicts)} "
        f"({sorted({c.split(':')[0] for c in conflicts})}); ingest commits retried: "
        f"{len(raced)}: {raced[:2]}"
    )
