"""Table maintenance beside a running ``ingest run`` on the Apache Kafka test broker.

The run's own passes come every second (``maintenance.interval``), and the test runs
``ingest maintain``'s pass (``maintain_tables``) in a loop beside it: compactions
race the run's batch commits and each other. ``verify_exact`` (librdkafka and
delta-rs, none of ingest's code) judges the table at the end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.sink.maintenance.compact import COMPACTION_KEY
from ingest.sink.maintenance.maintain import TXN_RETENTION_PROPERTY
from ingest.supervisor.engine.maintainer import maintain_tables
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, create_topic, produce, verify_exact
from tests.runtime.support import InProcess, config, records, row_count, wait_until, write_config
from tests.sink.test_replace import append, landed

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4


def produce_range(broker: KafkaCluster, topic: str, start: int, count: int) -> None:
    produce(
        broker.bootstrap, topic, (r for p in range(PARTITIONS) for r in records(p, start, count))
    )


def test_compaction_beside_a_running_ingest_keeps_the_table_exact(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produce_range(broker, topic, 0, 500)
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={
            "trigger": {"max_age": "300ms"},
            "maintenance": {"interval": "1s", "checkpoint_every": 3},
        },
    )
    cfg = config(path)
    run = InProcess(group_run(cfg, spark=spark))
    stop = threading.Event()
    passes: list[int] = []
    errors: list[BaseException] = []

    def beside() -> None:
        while not stop.is_set():
            try:
                done = maintain_tables(cfg)[0]
            except BaseException as exc:  # a failed pass fails the test
                errors.append(exc)
                return
            if done.compaction is not None:
                passes.append(done.compaction.files_removed)

    maintainer = threading.Thread(target=beside, name="test-maintain")
    try:
        produced = 500
        wait_until(lambda: row_count(tmp_path / "table") > 0, 120, "the first batch")
        maintainer.start()
        for _ in range(12):
            produce_range(broker, topic, produced, 150)
            produced += 150
            time.sleep(0.4)
        wait_until(lambda: row_count(tmp_path / "table") >= PARTITIONS * produced, 120, "every row")
    finally:
        stop.set()
        if maintainer.is_alive():
            maintainer.join(60)
        outcome = run.stop()
    assert not errors, errors
    assert outcome.exit_code == 0, outcome.message
    verify_exact(
        broker.bootstrap, topic, group, cfg.table.uri, dead_letter_uri=cfg.dead_letter_uri()
    ).raise_if_not_exact()
    table = DeltaTable(cfg.table.uri)
    history = table.history()
    compactions = [h for h in history if COMPACTION_KEY in h]
    batches = [h for h in history if "ingest.commit" in h]
    # Compactions really ran between and beside the batches, and kept the files few.
    assert sum(1 for removed in passes if removed) >= 2, passes
    assert len(compactions) >= 3, len(compactions)
    assert len(table.file_uris()) < len(batches), (len(table.file_uris()), len(batches))


def test_ingest_run_refuses_a_table_whose_txns_expire(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    target, apps = landed(tmp_path)
    append(target, apps, 0, 300, 10, "more")
    DeltaTable(target.uri).alter.set_table_properties({TXN_RETENTION_PROPERTY: "interval 30 days"})
    create_topic(broker.bootstrap, topic, partitions=1)
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=Path(target.uri),
    )
    outcome = group_run(config(path), spark=spark).run()
    assert outcome.exit_code == 2
    assert f"{target.uri}: the table sets {TXN_RETENTION_PROPERTY} = 'interval 30 days'" in (
        outcome.message
    )
    assert outcome.batches == 0
