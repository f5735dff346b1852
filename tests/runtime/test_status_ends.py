"""``ingest status`` on the ends of a partition: lag against the last stable offset, an
open transaction holding it back, and the newest record's time (ListOffsets
MAX_TIMESTAMP) on Apache Kafka; no MAX_TIMESTAMP on Tansu, which closes the connection
on it although it advertises ListOffsets v7.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.supervisor.output.status import collect_status, render_text
from ingest.testing import (
    KafkaCluster,
    ProducedRecord,
    Transaction,
    create_topic,
    produce,
    produce_transactions,
    unique_name,
)
from tests.runtime.support import config, write_config

BASE_MS = 1_700_000_000_000
NEWEST_MS = BASE_MS + 86_400_000  # one record a day later than the rest, mid-partition


def _iso(stamp_ms: int) -> str:
    return dt.datetime.fromtimestamp(stamp_ms / 1000, dt.UTC).isoformat(timespec="seconds")


@pytest.fixture
def open_transaction(broker: KafkaCluster, topic: str) -> Iterator[Any]:
    """Partition 1: 20 committed transactional records (and their marker, offset 20),
    then 10 records of a transaction left open while the test runs."""
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic, partitions=2)
    committed = [ProducedRecord(b"c%d" % i, partition=1) for i in range(20)]
    produce_transactions(broker.bootstrap, topic, [Transaction(committed)])
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": unique_name("open-txn")}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"o%d" % i, partition=1)
    assert producer.flush(30) == 0
    yield producer
    producer.abort_transaction(30)


def _status_config(bootstrap: str, topic: str, tmp_path: Path, **source: Any) -> Any:
    path = write_config(
        tmp_path / "ingest.toml",
        bootstrap=bootstrap,
        topic=topic,
        group=unique_name("g-status"),
        table=tmp_path / "table",
    )
    cfg = config(path)
    if source:
        cfg = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, **source))
    return cfg


def test_an_open_transaction_holds_the_end_back_and_status_says_so(
    broker: KafkaCluster, topic: str, tmp_path: Path, open_transaction: Any
) -> None:
    cfg = _status_config(broker.bootstrap, topic, tmp_path)
    report = collect_status(cfg)
    row = report["partitions"][1]
    # 20 records and a commit marker are stable; the open transaction's 10 are not.
    assert (row["end"], row["high_watermark"], row["lag"]) == (21, 31, 21)
    assert report["lag_against"] == "last_stable_offset"
    assert report["held_back"] == {f"{topic}-1": 10}
    text = render_text(report)
    assert "against the last stable offset (isolation read_committed)" in text
    assert f"open transactions hold back offsets: {topic}-1 10" in text

    # read_uncommitted: the lag runs to the high watermark, and status says that instead.
    uncommitted = collect_status(
        _status_config(broker.bootstrap, topic, tmp_path, isolation_level="read_uncommitted")
    )
    row = uncommitted["partitions"][1]
    assert (row["end"], row["high_watermark"], row["lag"]) == (31, 31, 31)
    assert "against the high watermark (isolation read_uncommitted)" in render_text(uncommitted)


def test_a_decided_transaction_holds_nothing_back(
    broker: KafkaCluster, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    records = [ProducedRecord(b"a%d" % i, partition=0) for i in range(5)]
    produce_transactions(broker.bootstrap, topic, [Transaction(records, commit=False)])
    report = collect_status(_status_config(broker.bootstrap, topic, tmp_path))
    row = report["partitions"][0]
    assert (row["end"], row["high_watermark"]) == (6, 6)
    assert report["held_back"] == {}
    assert "hold back" not in render_text(report)


@pytest.mark.parametrize("server", ["broker", "tansu"])
def test_status_gives_the_newest_record_time_where_max_timestamp_is_offered(
    server: str, topic: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cluster = request.getfixturevalue(server)
    create_topic(cluster.bootstrap, topic, partitions=2)
    stamps = [BASE_MS + i for i in range(30)]
    stamps[12] = NEWEST_MS  # the newest is neither the first nor the last record
    produce(
        cluster.bootstrap,
        topic,
        [ProducedRecord(b"%d" % i, partition=0, timestamp_ms=t) for i, t in enumerate(stamps)],
    )
    report = collect_status(_status_config(cluster.bootstrap, topic, tmp_path))
    newest = [row["newest_record"] for row in report["partitions"]]
    if server == "tansu":
        assert newest == [None, None]  # not asked: Tansu 0.6.0 hangs up on MAX_TIMESTAMP
    else:
        assert newest == [_iso(NEWEST_MS), None]  # partition 1 is empty
    assert [row["end"] for row in report["partitions"]] == [30, 0]
    assert "newest_record" in render_text(report)
