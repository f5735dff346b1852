"""``source.topic_pattern`` on Apache Kafka: a running supervisor takes a topic created
after it started (a rebalance, no restart), leaves a topic it does not match alone, and
lets a deleted topic's partitions go without failing them or looping on errors."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, create_topic, delete_topic, produce, unique_name
from tests.runtime.support import InProcess, config, records, row_count, wait_until, write_config
from tests.runtime.test_consumer_protocol import consumer_group_settings


def topics_in(uri: Path) -> dict[str, int]:
    table = DeltaTable(str(uri)).to_pyarrow_table(columns=["topic"])
    counts = pc.value_counts(table.column("topic")).to_pylist()
    return {row["values"]: row["counts"] for row in counts}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_pattern_takes_new_topics_and_lets_deleted_ones_go(
    broker: KafkaCluster, tmp_path: Path, protocol: str
) -> None:
    prefix = unique_name("pat")
    group = unique_name("g")
    if protocol == "consumer":  # KIP-848: the coordinator's heartbeat interval, per group
        consumer_group_settings(broker.bootstrap, group)
    first = create_topic(broker.bootstrap, f"{prefix}.first", partitions=2)
    unmatched = create_topic(broker.bootstrap, unique_name("nopat"), partitions=1)
    produce(broker.bootstrap, first, records(0, 0, 50) + records(1, 0, 50))
    produce(broker.bootstrap, unmatched, records(0, 0, 10))
    table = tmp_path / "table"
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic="unused",
        group=group,
        table=table,
        sections={
            "source": {
                "topics": [],
                "topic_pattern": re.escape(prefix) + r"\..+",
                "metadata_refresh": "1s",
                "group_protocol": protocol,
            }
        },
    )
    run = InProcess(group_run(config(path)))
    try:
        wait_until(lambda: table.exists() and row_count(table) == 100, 60, "the first topic")
        second = create_topic(broker.bootstrap, f"{prefix}.second", partitions=1)
        produce(broker.bootstrap, second, records(0, 0, 30))
        created = time.monotonic()
        wait_until(lambda: row_count(table) == 130, 60, "the topic created after the start")
        print(f"a new topic's rows landed {time.monotonic() - created:.1f}s after it was made")

        delete_topic(broker.bootstrap, first)
        member = run.engine.source.member
        wait_until(
            lambda: (
                not any(p.topic == first for p in member.assignment)
                and not any(p.topic == first for p in run.engine.states)
            ),
            30,
            "the deleted topic's partitions released",
        )
        produce(broker.bootstrap, second, records(0, 30, 20))
        wait_until(lambda: row_count(table) == 150, 60, "rows after the deletion")
        assert run.alive
    finally:
        outcome = run.stop()
    assert outcome.exit_code == 0, outcome.message
    assert outcome.failed == {}
    assert topics_in(table) == {first: 100, second: 50}  # never the unmatched topic
    offsets = DeltaTable(str(table)).to_pyarrow_table(columns=["topic", "partition", "offset"])
    keys = set(zip(*(offsets.column(c).to_pylist() for c in offsets.column_names), strict=True))
    assert len(keys) == offsets.num_rows  # each offset once
