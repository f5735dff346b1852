"""``table.uri = ".../{topic}"``: each topic lands in a table of its own, created on
demand, one Delta commit per table. A process killed between two tables' commits of one
batch (the fault point ``between_table_commits``) leaves one table committed and the
other not, and no offset committed; the rerun lands the rest with no duplicate and no
gap. ``ingest status`` shows each table's txn versions and lag."""

from __future__ import annotations

import re
from pathlib import Path

from deltalake import DeltaTable

from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, create_topic, produce, unique_name, verify_exact
from ingest.testing.faults import fault_point_env
from tests.runtime.support import Cli, config, group_offsets, records, status_json, write_config


def test_each_topic_its_own_table_and_a_crash_between_their_commits_is_repaired(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    prefix = unique_name("tt")
    topics = [create_topic(broker.bootstrap, f"{prefix}.{name}", partitions=2) for name in "ab"]
    for n, topic in enumerate(topics):
        produce(broker.bootstrap, topic, records(0, 0, 40 + n) + records(1, 0, 30 + n))
    lake = tmp_path / "lake"
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic="unused",
        group=unique_name("g"),
        table=lake / "{topic}",
        sections={"source": {"topics": [], "topic_pattern": re.escape(prefix) + r"\..+"}},
    )
    cfg = config(path)
    args = ["run", "--until-end", "--config", str(path)]
    killed = Cli(args, tmp_path / "killed.log", env=fault_point_env("between_table_commits", 1))
    assert killed.wait(120) == -9, killed.text()[-3000:]
    landed = [t for t in topics if (lake / t / "_delta_log").exists()]
    assert landed == topics[:1]  # the first table committed, the second not
    partitions = [Partition(t, p) for t in topics for p in (0, 1)]
    assert set(group_offsets(cfg, partitions).values()) == {None}  # no offset moved

    rerun = Cli(args, tmp_path / "rerun.log")
    assert rerun.wait(120) == 0, rerun.text()[-3000:]
    for topic in topics:
        table = str(lake / topic)
        verify_exact(
            broker.bootstrap, topic, cfg.source.group_id, table, dead_letter_uri=f"{table}_dead_letters"
        ).raise_if_not_exact()  # fmt: skip
        assert set(DeltaTable(table).to_pyarrow_table().column("topic").to_pylist()) == {topic}

    report = status_json(path)
    assert [t["uri"] for t in report["tables"]] == [str(lake / t) for t in topics]
    assert all(t["lag"] == 0 and t["last_commit"] for t in report["tables"])
    by_partition = {(r["topic"], r["partition"]): r for r in report["partitions"]}
    assert by_partition[(topics[1], 0)]["table"] == str(lake / topics[1])
    assert by_partition[(topics[1], 0)]["txn_version"] == 40
