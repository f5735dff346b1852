"""``ingest replay --overwrite``: a range lands again as the current configuration reads it.

The story: a transform dead-lettered rows by a wrong rule. After the rule is
fixed, an overwrite replay of a range puts those rows in the table and takes
their dead letters out, while every offset stays in exactly one of the two
tables and nothing outside the range changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ingest.errors import ConfigError
from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.modes.replay import Position, replay_run
from ingest.supervisor.output.progress import Progress
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.runtime.support import config, write_config

pytestmark = pytest.mark.spark

PER_PARTITION = 1000
WRONG_RULE = (
    "SELECT *, CASE WHEN id % 10 = 0 THEN 'id is a multiple of 10' END AS _dead_letter FROM batch"
)
FIXED_RULE = "SELECT *, CASE WHEN id < 0 THEN 'negative id' END AS _dead_letter FROM batch"


def offsets_by_partition(uri: Path) -> dict[int, np.ndarray]:
    rows = DeltaTable(str(uri)).to_pyarrow_table(columns=["partition", "offset"])
    partitions = rows.column("partition").to_numpy()
    offsets = rows.column("offset").to_numpy()
    return {int(p): np.sort(offsets[partitions == p]) for p in np.unique(partitions)}


def txn_versions(uri: Path, topic: str, cfg: Any) -> list[int | None]:
    from ingest.sink.txn import app_id

    table = DeltaTable(str(uri))
    return [
        table.transaction_version(app_id(cfg.table.uri, cfg.source.group_id, topic, p))
        for p in (0, 1)
    ]


def write(
    tmp_path: Path, broker: KafkaCluster, topic: str, group: str, rule: str, name: str
) -> Any:
    path = write_config(
        tmp_path / f"{name}.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        # Small segments: the replayed range cuts through the files of the first run.
        sections={
            "handoff": {"segment_max_bytes": "16KiB"},
            "table": {"transform": rule},
            "table.value": {"format": "json", "schema": "id BIGINT, amount DOUBLE"},
        },
    )
    return config(path)


def overwrite_200_to_599(cfg: Any, spark: Any) -> Any:
    """``ingest replay --from 200 --to 600 --partitions 0 --overwrite``, in this process."""
    return replay_run(
        cfg,
        start=Position("offset", 200),
        end=Position("offset", 600),
        partitions=[0],
        overwrite=True,
        spark=spark,
        progress=Progress("replay"),
    ).run()


def test_an_overwrite_replay_replaces_the_range_in_the_table_and_the_dead_letters(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    topic, group = unique_name("t-overwrite"), unique_name("g-overwrite")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(
        broker.bootstrap,
        topic,
        (
            ProducedRecord(b'{"id": %d, "amount": %d.5}' % (n, n), partition=p)
            for p in (0, 1)
            for n in range(PER_PARTITION)
        ),
    )
    wrong = write(tmp_path, broker, topic, group, WRONG_RULE, "wrong")
    outcome = group_run(wrong, until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message
    table, dead = tmp_path / "table", Path(wrong.dead_letter_uri())
    every = np.arange(PER_PARTITION)
    rejected = every[every % 10 == 0]
    assert offsets_by_partition(dead)[0].tolist() == rejected.tolist()
    files_before = set(DeltaTable(str(table)).file_uris())
    versions_before = txn_versions(table, topic, wrong)

    fixed = write(tmp_path, broker, topic, group, FIXED_RULE, "fixed")
    outcome = overwrite_200_to_599(fixed, spark)
    assert outcome.exit_code == 0, outcome.message

    in_range = (every >= 200) & (every < 600)
    kept_dead = rejected[(rejected < 200) | (rejected >= 600)]
    landed = offsets_by_partition(table)
    assert landed[0].tolist() == every[in_range | (every % 10 != 0)].tolist()
    assert landed[1].tolist() == every[every % 10 != 0].tolist()  # untouched
    dead_now = offsets_by_partition(dead)
    assert dead_now[0].tolist() == kept_dead.tolist()
    assert dead_now[1].tolist() == rejected.tolist()
    # Each offset is in exactly one of the tables, once.
    both = np.sort(np.concatenate([landed[0], dead_now[0]]))
    assert both.tolist() == every.tolist()
    # The txn versions stayed: the table still holds partition 0 through offset 999.
    assert txn_versions(table, topic, fixed) == versions_before
    # The files that held rows of the range were replaced, not appended to.
    files_after = set(DeltaTable(str(table)).file_uris())
    assert files_before - files_after and files_after - files_before
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset", "amount"])
    chosen = rows.filter(pa.compute.equal(rows.column("partition"), 0))
    amounts = dict(
        zip(chosen.column("offset").to_pylist(), chosen.column("amount").to_pylist(), strict=True)
    )
    assert amounts[200] == 200.5 and amounts[599] == 599.5

    # Again: an overwrite is idempotent.
    again = overwrite_200_to_599(fixed, spark)
    assert again.exit_code == 0, again.message
    assert offsets_by_partition(table)[0].tolist() == landed[0].tolist()
    assert offsets_by_partition(dead)[0].tolist() == kept_dead.tolist()


def test_overwrite_is_refused_in_upsert_mode(broker: KafkaCluster, tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "upsert.toml",
        bootstrap=broker.bootstrap,
        topic="t",
        group="g",
        table=tmp_path / "table",
        sections={
            "table": {"mode": "upsert", "merge_keys": ["id"]},
            "table.value": {"format": "json", "schema": "id BIGINT"},
        },
    )
    with pytest.raises(ConfigError, match="--overwrite: applies to append mode"):
        replay_run(config(path), start=Position("earliest"), overwrite=True)
