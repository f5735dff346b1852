"""Maintenance of a table ingest commits to through Delta Spark (row tracking, deletion
vectors, in-commit timestamps, v2 checkpoints, clustering: a platform's table): ingest's
own compaction cannot rewrite it (delta-rs refuses to commit there), so a pass runs Delta
Spark's OPTIMIZE and VACUUM through the Spark engine (``ingest/engines/spark/optimize.py``).

Several runs leave several small files; a pass through the shared session, then one through
``ingest maintain`` (its own process and JVM), must leave every row with its row id and
values, the deleted rows deleted, the clustering kept, and delete an orphan file only when
VACUUM is full.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.engines.spark.optimize import SparkTableMaintenance
from ingest.supervisor.engine.maintainer import maintain_tables
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.delta.interop_support import SPARK_IDS, create_spark_table, run, spark_rows
from tests.runtime.support import ROOT, config, write_config

pytestmark = pytest.mark.spark

PLATFORM = {
    "delta.enableDeletionVectors": "true",
    "delta.enableRowTracking": "true",
    "delta.enableInCommitTimestamps": "true",
    "delta.checkpointPolicy": "v2",
}
ROUNDS = 3
PER_ROUND = 20


def _records(start: int) -> list[ProducedRecord]:
    return [
        ProducedRecord(json.dumps({"id": n, "v": f"v{n}"}).encode(), partition=n % 2)
        for n in range(start, start + PER_ROUND)
    ]


def _live_files(table: Path) -> int:
    return len(DeltaTable(str(table)).file_uris())


def _maintenance_config(
    tmp_path: Path, broker: KafkaCluster, table: Path, full: bool, retention: str = "7d"
) -> Path:
    return write_config(
        tmp_path / f"maintain-{full}-{retention}.toml",
        bootstrap=broker.bootstrap,
        topic="unused",
        group="unused",
        table=table,
        sections={"maintenance": {"vacuum_full": full, "vacuum_retention": retention}},
    )


def test_delta_spark_maintains_a_platform_table(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    topic, group = unique_name("t-optimize"), unique_name("g-optimize")
    create_topic(broker.bootstrap, topic, partitions=2)
    table = tmp_path / "platform"
    create_spark_table(spark, table, properties=PLATFORM, cluster_by="id")
    spark.sql(f"DELETE FROM delta.`{table}` WHERE id IN (1001, 1003)")  # a deletion vector
    for round_ in range(ROUNDS):
        produce(broker.bootstrap, topic, _records(round_ * PER_ROUND))
        outcome = run(
            spark, tmp_path, bootstrap=broker.bootstrap, topic=topic, table=table, group=group
        )
        assert outcome.exit_code == 0, outcome.message
    kept = sorted([(i, f"spark{i}") for i in SPARK_IDS if i not in (1001, 1003)])
    expected = sorted(kept + [(n, f"v{n}") for n in range(ROUNDS * PER_ROUND)])
    before = spark_rows(spark, table, "_metadata.row_id, id, v")
    assert sorted((i, v) for _, i, v in before) == expected
    files = _live_files(table)
    assert files > 2, files
    orphan = table / "part-orphan-of-a-killed-run.parquet"
    orphan.write_bytes(b"not a data file of this table")
    month_ago = time.time() - 30 * 86400
    os.utime(orphan, (month_ago, month_ago))

    # A pass beside the shared session, VACUUM LITE: only files the log removed may go.
    lite = config(_maintenance_config(tmp_path, broker, table, full=False))
    active = spark._jvm.org.apache.spark.sql.SparkSession.getActiveSession
    before_active = active()
    maintenance = SparkTableMaintenance(spark)
    (report,) = [
        r
        for r in maintain_tables(lite, delta_spark=lambda: maintenance)
        if r.uri.endswith("platform")
    ]
    assert active().equals(before_active), "the pass left its own session active"
    assert report.skipped is None, report
    compaction = report.compaction
    assert compaction is not None and compaction.version is not None
    assert (compaction.files_removed, compaction.files_added) == (files, 1), compaction
    assert compaction.rows == len(expected)
    assert report.vacuumed == () and orphan.exists()  # LITE, and nothing removed a week ago
    # vacuum_retention above the table's own (7 days unset): Delta Spark's VACUUM would
    # ignore it, so the table is not vacuumed, and the orphan a full VACUUM deletes stays.
    longer = config(_maintenance_config(tmp_path, broker, table, full=True, retention="30d"))
    (report,) = maintain_tables(longer, delta_spark=lambda: maintenance)[:1]
    assert report.vacuumed == () and "vacuum" not in report.seconds and orphan.exists()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert {h.operation for h in history if h.version == compaction.version} == {"OPTIMIZE"}

    # Every row as it was, with its row id; the deleted rows stay deleted; the clustering
    # and the protocol stay; Spark reads the OPTIMIZE's version and writes after it.
    assert spark_rows(spark, table, "_metadata.row_id, id, v") == before
    assert _live_files(table) == 1
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").collect()[0]
    assert detail.clusteringColumns == ["id"] and detail.numFiles == 1
    assert "rowTracking" in detail.tableFeatures and "deletionVectors" in detail.tableFeatures

    # ``ingest maintain`` in its own process, VACUUM full: the month-old orphan goes.
    full = _maintenance_config(tmp_path, broker, table, full=True)
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "maintain", "--json", "--config", str(full)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    reports = {Path(r["table"]).name: r for r in json.loads(done.stdout)}
    assert reports["platform"]["skipped"] is None, reports
    assert reports["platform"]["vacuumed"] == 1 and not orphan.exists(), reports
    assert reports["platform"]["compacted_files"] == 0  # one file: nothing to compact
    assert spark_rows(spark, table, "_metadata.row_id, id, v") == before
    spark.sql(f"INSERT INTO delta.`{table}` (id, v) VALUES (5000, 'after')")
    assert spark_rows(spark, table, "id, v") == sorted([*expected, (5000, "after")])
