"""A partition revoked from an ``--until-end`` run after its worker fetched to the end, and
before the batch holding its records started: the run must not commit its end offset (the
records were dropped with the revocation, never landed), or the new owner starts at the end
and the rows are lost.

Found by ``scripts/bench/scale.py`` (two hosts starting together, the second's join while
the first's Spark was starting), fixed in ``PartitionState.commit_target``. Made certain
here: supervisor A's ``spark.master`` is a standalone master with no worker yet, so A
fetches everything and cannot start a batch; B joins (local engine) and takes half of the
partitions; then a worker comes up and A lands its half. Without the fix it failed 2 runs
of 2 (A committed the revoked partitions' ends, B landed nothing); with it, passed 2 of 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.testing import (
    KafkaCluster,
    SparkCluster,
    create_topic,
    produce,
    set_group_configs,
    verify_exact,
)
from tests.cluster.support import RUN_TIMEOUT, cluster_config
from tests.runtime.support import Cli, records

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

PARTITIONS = 4
PER_PARTITION = 5_000


@pytest.fixture
def workerless(tmp_path: Path) -> Iterator[SparkCluster]:
    """A master whose one worker is not started yet (``restart_worker(0)`` starts it)."""
    cluster = SparkCluster(1, work_dir=tmp_path / "spark")
    try:
        cluster.start_master()
        yield cluster
    finally:
        cluster.stop()


def test_a_partition_revoked_before_its_records_landed_keeps_its_offset(
    workerless: SparkCluster, broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produced = produce(
        broker.bootstrap,
        topic,
        (r for p in range(PARTITIONS) for r in records(p, 0, PER_PARTITION)),
        compression="lz4",
    )
    assert produced == PARTITIONS * PER_PARTITION
    handoff, table = tmp_path / "handoff", tmp_path / "table"
    handoff.mkdir()
    common = {
        "bootstrap": broker.bootstrap,
        "topic": topic,
        "group": group,
        "table": str(table),
        "handoff_root": str(handoff),
    }
    # KIP-848: its commits carry no generation, so the revocation's commit always reaches
    # the coordinator (with the classic protocol a commit made from the books of the
    # generation before is refused locally about two runs in three, hiding the fault).
    # The group's heartbeat and session are the coordinator's (tests/runtime/
    # test_consumer_protocol.py); the members' session matches it.
    set_group_configs(
        broker.bootstrap,
        group,
        {"consumer.heartbeat.interval.ms": 500, "consumer.session.timeout.ms": 6_000},
    )
    sections = {"source": {"group_protocol": "consumer", "session_timeout": "6s"}}
    a_path = cluster_config(
        tmp_path / "a.toml", master=workerless.master_url, sections=sections, **common
    )
    b_sections = {**sections, "spark": {"master": "local[2]", "engine": "local"}}
    b_path = cluster_config(tmp_path / "b.toml", master="local[2]", sections=b_sections, **common)
    a = Cli(["run", "-c", str(a_path), "--until-end"], tmp_path / "a.log")
    b: Cli | None = None
    try:
        # A owns every partition and has fetched each to its end; no executor, no batch.
        a.wait_for_event("worker_finished", 60, count=PARTITIONS)
        b = Cli(["run", "-c", str(b_path), "--until-end"], tmp_path / "b.log")
        a.wait_for_event("partitions_revoked", 60)
        assert "event=batch_started" not in a.text(), "A started a batch before the revocation"
        workerless.restart_worker(0)
        codes = (a.wait(RUN_TIMEOUT), b.wait(RUN_TIMEOUT))
    finally:
        a.kill()
        if b is not None:
            b.kill()
    assert codes == (0, 0), a.text()[-3000:] + b.text()[-3000:]
    landed_by_b = sum(
        int(line.split(" rows=")[1].split()[0]) for line in b.lines("batch_committed")
    )
    assert landed_by_b > 0, "B landed nothing: the revoked partitions' offsets were at the end"
    verdict = verify_exact(broker.bootstrap, topic, group, str(table))
    verdict.raise_if_not_exact()
    assert verdict.rows == PARTITIONS * PER_PARTITION
