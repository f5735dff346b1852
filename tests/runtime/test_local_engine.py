"""The local engine (ingest/engines/local/task_pool.py): batches without a transform on a local master land
through a pool of task processes, with no JVM, by the same landing protocol as on Spark.

The choice is a table (``LocalEngine.choose``); a run on it is exact, dead letters included;
a task process that dies fails one batch, which lands on a new pool.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.config import SparkSection
from ingest.engines.landing import choose_engine
from ingest.engines.local.local_engine import LocalEngine, local_cores
from ingest.errors import ConfigError
from ingest.sink.table_config import TableConfig
from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.output.metrics import Metrics
from ingest.testing import (
    KafkaCluster,
    ProducedRecord,
    create_topic,
    produce,
    unique_name,
    verify_exact,
)
from ingest.testing.faults import process_tree
from tests.runtime.support import config, write_config
from tests.sink.test_features import hand_written_table

JSON = "id BIGINT, name STRING, at TIMESTAMP"


def table(**changes: object) -> TableConfig:
    values: dict[str, object] = {
        "uri": "/tmp/t",
        "group": "g",
        "value_format": "json",
        "value_schema": JSON,
    }
    values.update(changes)
    return TableConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "master", "changes", "local"),
    [
        ("auto", "local[2]", {}, True),
        ("auto", "local[*]", {"value_format": "binary", "value_schema": None}, True),
        ("local", "local", {}, True),
        ("auto", "local[2]", {"transform": "SELECT * FROM batch"}, False),
        ("auto", "local[2]", {"value_schema": "id BIGINT, code CHAR(3)"}, False),
        ("auto", "local-cluster[2,1,1024]", {}, False),
        ("auto", "spark://master:7077", {}, False),
        ("spark", "local[2]", {}, False),
    ],
)
def test_where_batches_run(
    engine: str, master: str, changes: dict[str, object], local: bool
) -> None:
    section = SparkSection(master=master, engine=engine)  # type: ignore[arg-type]
    chosen = choose_engine(section, table=table(**changes))
    assert isinstance(chosen, LocalEngine) is local
    # A session given (tests, the chaos reruns) is always used.
    assert not isinstance(choose_engine(section, object(), table=table(**changes)), LocalEngine)


@pytest.mark.parametrize(
    ("master", "changes", "why"),
    [
        ("local[2]", {"transform": "SELECT * FROM batch"}, "the table has a transform"),
        ("spark://m:7077", {}, "spark.master 'spark://m:7077' is not local"),
        ("local[2]", {"value_schema": "v VARIANT"}, "a type only Spark can read into Arrow"),
    ],
)
def test_engine_local_refuses_what_it_cannot_run(
    master: str, changes: dict[str, object], why: str
) -> None:
    with pytest.raises(ConfigError) as info:
        choose_engine(SparkSection(master=master, engine="local"), table=table(**changes))
    assert why in str(info.value) and "spark.engine" in str(info.value)


def test_a_table_only_delta_spark_commits_to_runs_on_spark(tmp_path: Path) -> None:
    """Row tracking (like clustering, in-commit timestamps...): "auto" picks Spark, whose
    driver commits through Delta Spark's transaction; "local" refuses, naming it."""
    hand_written_table(tmp_path, "rowTracking", reader=False)
    target = table(uri=str(tmp_path))
    assert not isinstance(choose_engine(SparkSection(master="local[2]"), table=target), LocalEngine)
    with pytest.raises(ConfigError, match=r"Delta Spark's transaction .*rowTracking"):
        choose_engine(SparkSection(master="local[2]", engine="local"), table=target)


def test_a_replay_that_cuts_a_deletion_vector_table_runs_on_spark(tmp_path: Path) -> None:
    """Appends to a table with deletion vectors run on the local engine; a replay with
    --overwrite needs Delta Spark's transaction for its cut (its removes name the vectors):
    "auto" picks Spark, "local" refuses naming the feature."""
    hand_written_table(tmp_path, "deletionVectors", reader=True)
    target = table(uri=str(tmp_path))
    auto = SparkSection(master="local[2]")
    assert isinstance(choose_engine(auto, table=target), LocalEngine)
    assert not isinstance(choose_engine(auto, table=target, overwrite=True), LocalEngine)
    with pytest.raises(ConfigError, match=r"Delta Spark's transaction .*deletionVectors"):
        choose_engine(SparkSection(master="local[2]", engine="local"), table=target, overwrite=True)


def test_local_master_cores() -> None:
    assert local_cores("local") == 1
    assert local_cores("local[3]") == 3
    assert local_cores("local[4, 2]") == 4
    assert local_cores("local[*]") == (os.cpu_count() or 1)
    assert local_cores("spark://h:7077") is None
    assert local_cores("local-cluster[2,1,1024]") is None


def produce_events(bootstrap: str, topic: str, count: int) -> None:
    records = [
        ProducedRecord(
            b'{"id": %d, "name": "n%d", "at": "2026-11-24T10:00:00Z"}' % (n, n)
            if n % 97
            else b"{not json",  # a dead letter
            partition=n % 4,
        )
        for n in range(count)
    ]
    produce(bootstrap, topic, records)


def write(tmp_path: Path, broker: KafkaCluster, topic: str, group: str) -> Path:
    return write_config(
        tmp_path / "local.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"table.value": {"format": "json", "schema": JSON}},
    )


@pytest.mark.quick
def test_an_until_end_run_lands_on_the_local_engine_without_a_jvm(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic, group = unique_name("t-local"), unique_name("g-local")
    create_topic(broker.bootstrap, topic, partitions=4)
    produce_events(broker.bootstrap, topic, 4_000)
    cfg = config(write(tmp_path, broker, topic, group))
    engine = group_run(cfg, until_end=True)
    assert isinstance(engine.lander, LocalEngine)
    jvms = {p.pid for p in process_tree(os.getpid()) if p.kind == "jvm"}
    outcome = engine.run()
    assert outcome.exit_code == 0, outcome.message
    # No Spark session, so no JVM, was started by the run.
    assert {p.pid for p in process_tree(os.getpid()) if p.kind == "jvm"} <= jvms
    verdict = verify_exact(
        broker.bootstrap, topic, group, cfg.table.uri, dead_letter_uri=cfg.dead_letter_uri()
    )
    verdict.raise_if_not_exact()
    assert verdict.dead_letters == len(range(0, 4_000, 97))


def test_a_dead_task_process_fails_one_batch_and_a_new_pool_lands_it(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic, group = unique_name("t-local-kill"), unique_name("g-local-kill")
    create_topic(broker.bootstrap, topic, partitions=4)
    produce_events(broker.bootstrap, topic, 2_000)
    cfg = config(write(tmp_path, broker, topic, group))
    metrics = Metrics()
    engine = group_run(cfg, until_end=True, metrics=metrics)
    assert isinstance(engine.lander, LocalEngine)
    engine.lander.tasks.warm()
    tasks = [p for p in process_tree(os.getpid()) if p.kind == "task"]
    assert len(tasks) == engine.lander.tasks.cores, tasks
    os.kill(tasks[0].pid, signal.SIGKILL)
    outcome = engine.run()
    assert outcome.exit_code == 0, outcome.message
    verify_exact(
        broker.bootstrap, topic, group, cfg.table.uri, dead_letter_uri=cfg.dead_letter_uri()
    ).raise_if_not_exact()
    text = metrics.render()
    assert 'ingest_batches_total{outcome="failed"} 1' in text, text


def test_a_date_column_partitions_the_table_by_each_records_utc_day(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    """``table.date_column = "day"`` with ``partition_by = ["day"]``: every row's day is its
    Kafka timestamp's UTC date, and the table is partitioned by it, as docs/delta-compat.md
    advises beside Spark DML."""
    topic, group = unique_name("t-day"), unique_name("g-day")
    create_topic(broker.bootstrap, topic, partitions=2)
    base = int(dt.datetime(2026, 1, 1, 22, 0, tzinfo=dt.UTC).timestamp() * 1000)
    stamps = [base + n * 15 * 60_000 for n in range(12)]  # 22:00 on the 1st to 00:45 on the 2nd
    produce(
        broker.bootstrap,
        topic,
        [
            ProducedRecord(
                b'{"id": %d, "name": "n", "at": null}' % n, partition=n % 2, timestamp_ms=stamp
            )
            for n, stamp in enumerate(stamps)
        ],
    )
    path = write_config(
        tmp_path / "day.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={
            "table": {
                "uri": str(tmp_path / "table"),
                "date_column": "day",
                "partition_by": ["day"],
            },
            "table.value": {"format": "json", "schema": JSON},
        },
    )
    outcome = group_run(config(path), until_end=True).run()
    assert outcome.exit_code == 0, outcome.message
    table = DeltaTable(str(tmp_path / "table"))
    assert table.metadata().partition_columns == ["day"]
    rows = table.to_pyarrow_table(columns=["id", "timestamp", "day"]).sort_by("id").to_pylist()
    assert [r["id"] for r in rows] == list(range(12))
    for row, stamp in zip(rows, stamps, strict=True):
        assert row["day"] == dt.datetime.fromtimestamp(stamp / 1000, dt.UTC).date(), row
    assert [r["day"] for r in rows] == [dt.date(2026, 1, 1)] * 8 + [dt.date(2026, 1, 2)] * 4
    paths = {Path(uri).parent.name for uri in table.file_uris()}
    assert paths == {"day=2026-01-01", "day=2026-01-02"}
