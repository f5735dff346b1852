"""Tombstones delete in upsert mode, through ``ingest run --until-end`` on the real broker.

The story of issue 17 item 6: a user tombstones keys of a key-partitioned topic and
expects their rows gone. Each run lands what was produced since the last one as one
batch per run (the records are produced before the run starts), so changes of a key in
one production meet in one MERGE, and changes in separate productions meet across
batches. ``verify_upsert`` replays the topic by the rule stated here and compares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from deltalake import DeltaTable

from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.modes.replay import Position, replay_run
from ingest.supervisor.output.progress import Progress
from ingest.testing import (
    Change,
    ConsumedRecord,
    KafkaCluster,
    ProducedRecord,
    create_topic,
    produce,
    unique_name,
    verify_upsert,
)
from tests.runtime.support import config, write_config

pytestmark = pytest.mark.spark

KEYS = 200
TOMBSTONED = 85  # keys 0..84


def upsert(n: int, version: int) -> ProducedRecord:
    return ProducedRecord(b'{"id": %d, "name": "v%d"}' % (n, version), key=b"%d" % n)


def tombstone(n: int | None) -> ProducedRecord:
    return ProducedRecord(None, key=None if n is None else b"%d" % n)


def change_of(record: ConsumedRecord) -> Change | None:
    if record.value is None:
        assert record.key is not None
        return Change((int(record.key),), delete=True)
    return Change((orjson.loads(record.value)["id"],))


def null_keyed_tombstone(record: ConsumedRecord) -> bool:
    return record.value is None and record.key is None


def names(uri: Path) -> dict[int, str]:
    rows = DeltaTable(str(uri)).to_pyarrow_table(columns=["id", "name"]).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key has two rows"
    return {r["id"]: r["name"] for r in rows}


def run(cfg: Any, spark: Any) -> None:
    outcome = group_run(cfg, until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message


def test_tombstones_delete_their_keys_and_the_last_change_by_offset_wins(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    topic, group = unique_name("t-tomb"), unique_name("g-tomb")
    create_topic(broker.bootstrap, topic, partitions=4)
    table = tmp_path / "customers"
    path = write_config(
        tmp_path / "upsert.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=table,
        # tombstones unset: "delete" is upsert's default.
        sections={
            "table": {"mode": "upsert", "merge_keys": ["id"]},
            "table.value": {"format": "json", "schema": "id BIGINT, name STRING"},
        },
    )
    cfg = config(path)
    assert cfg.table.tombstones is None

    def verify() -> None:
        verify_upsert(
            broker.bootstrap,
            topic,
            group,
            str(table),
            key_columns=["id"],
            change_of=change_of,
            dead_letter_uri=cfg.dead_letter_uri(),
            dead=null_keyed_tombstone,
        ).raise_if_not_exact()

    # The librdkafka producer partitions by key: every change of a key in one partition.
    produce(broker.bootstrap, topic, [upsert(n, 1) for n in range(KEYS)])
    run(cfg, spark)
    assert names(table) == {n: "v1" for n in range(KEYS)}

    produce(
        broker.bootstrap,
        topic,
        [tombstone(n) for n in range(TOMBSTONED)]
        # In one batch: updated then tombstoned; tombstoned then re-created; updated.
        + [upsert(100, 2), tombstone(100), tombstone(101), upsert(101, 2), upsert(102, 2)]
        + [tombstone(None)],  # names no row: a dead letter
    )
    run(cfg, spark)
    after = names(table)
    still = [n for n in range(TOMBSTONED) if n in after]
    assert still == [], f"{len(still)} of {TOMBSTONED} tombstoned keys are still present"
    assert 100 not in after and after[101] == "v2" and after[102] == "v2"
    assert len(after) == KEYS - TOMBSTONED - 1
    [dead] = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    assert dead["value"] is None and dead["key"] is None
    assert dead["error_message"] == "a null key: nothing names the row to delete"
    verify()

    # Across batches: a deleted key re-created, an updated key deleted.
    produce(broker.bootstrap, topic, [upsert(0, 3), tombstone(102)])
    run(cfg, spark)
    after = names(table)
    assert after[0] == "v3" and 102 not in after
    verify()

    # Exactly once: the same offsets again, by the group's replay (its txn versions drop
    # them) and by a second run; the table, its txn versions and its rows stay.
    version = DeltaTable(str(table)).version()
    replay = replay_run(
        cfg,
        start=Position("earliest"),
        spark=spark,
        progress=Progress("replay"),
    ).run()
    assert replay.exit_code == 0, replay.message
    run(cfg, spark)
    assert DeltaTable(str(table)).version() == version
    assert names(table) == after
    verify()


def test_another_group_replaying_every_offset_in_one_batch_gives_the_same_table(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    """A re-run of the whole topic by a new group (new app ids: nothing is filtered) merges
    every change at once; the latest per key decides, so the table comes out the same,
    and an older delete never removes the newer row the table holds."""
    topic = unique_name("t-tomb-rerun")
    create_topic(broker.bootstrap, topic, partitions=2)
    table = tmp_path / "t"
    produce(broker.bootstrap, topic, [upsert(n, 1) for n in range(20)])
    produce(broker.bootstrap, topic, [tombstone(n) for n in range(10)])
    produce(broker.bootstrap, topic, [upsert(n, 2) for n in range(5)])  # 0-4 re-created

    def config_of(group: str) -> Any:
        return config(
            write_config(
                tmp_path / f"{group}.toml",
                bootstrap=broker.bootstrap,
                topic=topic,
                group=group,
                table=table,
                sections={
                    "table": {"mode": "upsert", "merge_keys": ["id"], "tombstones": "delete"},
                    "table.value": {"format": "json", "schema": "id BIGINT, name STRING"},
                },
            )
        )

    first = config_of(unique_name("g-first"))
    run(first, spark)
    expected = {**{n: "v2" for n in range(5)}, **{n: "v1" for n in range(10, 20)}}
    assert names(table) == expected
    version = DeltaTable(str(table)).version()
    second = config_of(unique_name("g-second"))
    run(second, spark)
    assert names(table) == expected
    # Nothing changed, but the second group's txn versions were still committed.
    assert DeltaTable(str(table)).version() == version + 1
    for cfg in (first, second):
        verify_upsert(
            broker.bootstrap,
            topic,
            cfg.source.group_id,
            str(table),
            key_columns=["id"],
            change_of=change_of,
        ).raise_if_not_exact()
