"""Tables written by ingest, with Delta Spark on the other side: Spark reads exact rows at
every version and sees our commits in DESCRIBE HISTORY with their metrics. Spark writing at
the same time as ``ingest run``: test_partitioned_dml.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.runtime.support import config, write_config

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
