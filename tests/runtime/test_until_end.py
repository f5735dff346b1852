"""``ingest run --until-end``, ``ingest status`` and ``ingest replay`` on a large topic.

The supervisor runs in the test process with the session's Spark (a JVM per
run would cost ~10 s each); the CLI as a process is tested in test_cli.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.config import offsets_topic_partition
from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.modes.replay import Position, replay_run
from ingest.supervisor.output.metrics import Metrics
from ingest.supervisor.output.progress import Progress
from ingest.supervisor.output.status import collect_status
from ingest.testing import KafkaCluster, create_topic, produce, unique_name
from tests.runtime.support import (
    BASE_MS,
    assert_exact,
    broker_ends,
    config,
    group_offsets,
    records,
    row_count,
    table_version,
    write_config,
)

pytestmark = pytest.mark.spark

PARTITIONS = 8
PER_PARTITION = 200_000


@pytest.fixture(scope="module")
def big_topic(broker: KafkaCluster) -> Iterator[str]:
    topic = unique_name("t-until-end")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    started = time.monotonic()

    def generate() -> Iterator[Any]:
        for chunk in range(0, PER_PARTITION, 10_000):
            for partition in range(PARTITIONS):
                yield from records(partition, chunk, 10_000)

    produced = produce(broker.bootstrap, topic, generate(), compression="lz4")
    assert produced == PARTITIONS * PER_PARTITION
    print(f"produced {produced} records in {time.monotonic() - started:.1f}s")
    yield topic


@pytest.fixture(scope="module")
def landed(
    broker: KafkaCluster, big_topic: str, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """One --until-end run over the whole topic (shared by the tests below)."""
    work = tmp_path_factory.mktemp("until-end")
    path = write_config(
        work / "run.toml",
        bootstrap=broker.bootstrap,
        topic=big_topic,
        group=unique_name("g-until-end"),
        table=work / "table",
        # Several batches, several segments per partition per batch.
        sections={"trigger": {"max_bytes": "40MiB"}, "handoff": {"segment_max_bytes": "4MiB"}},
    )
    metrics = Metrics()
    started = time.monotonic()
    outcome = group_run(config(path), until_end=True, spark=spark, metrics=metrics).run()
    took = time.monotonic() - started
    print(f"--until-end: {outcome.batches} batches, {outcome.rows_written} rows in {took:.1f}s")
    return {"path": path, "outcome": outcome, "metrics": metrics, "table": work / "table"}


@pytest.mark.quick
def test_until_end_lands_each_offset_once_and_commits_the_end_offsets(
    landed: dict[str, Any],
) -> None:
    outcome = landed["outcome"]
    assert outcome.exit_code == 0, outcome.message
    assert outcome.rows_written == PARTITIONS * PER_PARTITION
    assert outcome.batches >= 3  # the trigger split it (40 MiB per batch)
    assert_exact(landed["table"], dict.fromkeys(range(PARTITIONS), PER_PARTITION))
    cfg = config(landed["path"])
    partitions = [Partition(cfg.source.topics[0], p) for p in range(PARTITIONS)]
    assert broker_ends(cfg, partitions) == dict.fromkeys(partitions, PER_PARTITION)
    assert group_offsets(cfg, partitions) == dict.fromkeys(partitions, PER_PARTITION)
    metrics = landed["metrics"]
    assert metrics.total("ingest_records_consumed_total") == PARTITIONS * PER_PARTITION
    assert metrics.total("ingest_rows_written_total") == PARTITIONS * PER_PARTITION


def test_a_second_run_with_no_new_data_does_nothing(landed: dict[str, Any], spark: Any) -> None:
    cfg = config(landed["path"])
    version = table_version(landed["table"])
    started = time.monotonic()
    outcome = group_run(cfg, until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message
    assert outcome.batches == 0 and outcome.rows_written == 0
    assert table_version(landed["table"]) == version
    print(f"the empty run took {time.monotonic() - started:.1f}s")


def test_status_reports_offsets_txn_versions_lag_and_the_group(landed: dict[str, Any]) -> None:
    cfg = config(landed["path"])
    report = collect_status(cfg)
    assert [
        (r["partition"], r["committed"], r["txn_version"], r["end"], r["lag"])
        for r in report["partitions"]
    ] == [(p, PER_PARTITION, PER_PARTITION - 1, PER_PARTITION, 0) for p in range(PARTITIONS)]
    assert report["total_lag"] == 0
    group = report["group"]
    assert group["id"] == cfg.source.group_id
    assert group["offsets_topic_partition"] == offsets_topic_partition(cfg.source.group_id, 50)
    assert group["coordinator"].startswith(cfg.kafka.bootstrap_servers[0])
    # The run left the group.
    assert group["state"] == "Empty" and group["members"] == []
    assert report["table"]["last_commit"]["version"] == table_version(landed["table"])
    # When each partition last took data: no later than the table's last commit.
    landed_at = [r["last_commit"] for r in report["partitions"]]
    assert None not in landed_at
    assert max(landed_at) <= report["table"]["last_commit"]["time"]
    # Another group has committed nothing and owns no txn version: all of it is lag.
    other = collect_status(
        dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, group_id="g-never"))
    )
    assert [
        (r["committed"], r["txn_version"], r["lag"], r["last_commit"]) for r in other["partitions"]
    ] == [(None, None, PER_PARTITION, None)] * PARTITIONS


def replay(cfg: Any, spark: Any, **kwargs: Any) -> Any:
    progress = Progress("replay")
    engine = replay_run(cfg, spark=spark, progress=progress, **kwargs)
    outcome = engine.run()
    return outcome, progress


def test_replaying_a_time_range_into_the_live_table_adds_nothing(
    landed: dict[str, Any], spark: Any
) -> None:
    cfg = config(landed["path"])
    version = table_version(landed["table"])
    rows = row_count(landed["table"])
    outcome, progress = replay(
        cfg,
        spark,
        start=Position("timestamp", BASE_MS + 1000),
        end=Position("timestamp", BASE_MS + 3000),
    )
    assert outcome.exit_code == 0, outcome.message
    assert outcome.rows_written == 0
    assert row_count(landed["table"]) == rows and table_version(landed["table"]) == version
    # It did read the range: 2000 records of each partition.
    assert (progress.done, progress.total) == (2000 * PARTITIONS, 2000 * PARTITIONS)


def test_a_time_range_replayed_into_a_new_table_is_exactly_that_range(
    landed: dict[str, Any], spark: Any, tmp_path: Path, broker: KafkaCluster
) -> None:
    cfg = config(landed["path"])
    fresh = tmp_path / "replayed"
    path = write_config(
        tmp_path / "replay.toml",
        bootstrap=broker.bootstrap,
        topic=cfg.source.topics[0],
        group=cfg.source.group_id,
        table=fresh,
    )
    replay_cfg = config(path)
    for _ in range(2):  # twice: the second adds nothing
        outcome, _ = replay(
            replay_cfg,
            spark,
            start=Position("timestamp", BASE_MS + 1000),
            end=Position("timestamp", BASE_MS + 3000),
            partitions=[0, 5],
        )
        assert outcome.exit_code == 0, outcome.message
        assert_exact(fresh, {0: 3000, 5: 3000}, starts={0: 1000, 5: 1000})
    # The replay never touches the group's committed offsets.
    partitions = [Partition(cfg.source.topics[0], p) for p in range(PARTITIONS)]
    assert group_offsets(cfg, partitions) == dict.fromkeys(partitions, PER_PARTITION)

    # Past the table's txn version with a gap: refused, nothing written.
    version = table_version(fresh)
    outcome, _ = replay(
        replay_cfg,
        spark,
        start=Position("offset", 5000),
        end=Position("offset", 6000),
        partitions=[0],
    )
    assert outcome.exit_code == 1
    assert "landing it would skip 3000-4999" in outcome.message
    assert table_version(fresh) == version
