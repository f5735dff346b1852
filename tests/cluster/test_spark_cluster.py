"""``ingest run --until-end`` on a Spark standalone cluster (``SparkCluster``: a master and
two workers, separate processes): ``spark.master`` is the one setting that differs from a
local run. The handoff is in files mode, on a local directory the executors share, or on
S3 with the table; each run is checked by ``verify_exact``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.testing import (
    KafkaCluster,
    S3Server,
    SparkCluster,
    unique_name,
    verify_exact,
)
from tests.cluster.support import (
    PARTITIONS,
    PER_PARTITION,
    SegmentWatch,
    cluster_config,
    local_segments,
    released_before_durable,
    run_until_end,
    s3_segments,
)

pytestmark = [pytest.mark.cluster, pytest.mark.spark]


def ran_on_the_cluster(cluster: SparkCluster, text: str) -> None:
    """The batches went through Spark on ``cluster`` (not the local engine), with an
    executor on each worker."""
    assert "local engine" not in text
    assert f"spark session {cluster.master_url} started" in text
    for index in range(len(cluster.workers)):
        apps = list((cluster.work_dir / f"worker-{index}" / "work").glob("app-*"))
        assert apps, f"worker {index} never ran an executor"


def test_until_end_with_segments_in_a_shared_directory(
    spark_cluster: SparkCluster,
    broker: KafkaCluster,
    cluster_topic: str,
    group: str,
    tmp_path: Path,
) -> None:
    handoff = tmp_path / "handoff"
    table = tmp_path / "table"
    path = cluster_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=cluster_topic,
        group=group,
        table=str(table),
        master=spark_cluster.master_url,
        handoff_root=str(handoff),
    )
    handoff.mkdir()
    with SegmentWatch(local_segments(handoff)) as watch:
        took, text = run_until_end(path, tmp_path / "run.log")
    verdict = verify_exact(broker.bootstrap, cluster_topic, group, str(table))
    verdict.raise_if_not_exact()
    assert verdict.rows == PARTITIONS * PER_PARTITION
    ran_on_the_cluster(spark_cluster, text)
    batches = text.count("event=batch_committed")
    print(f"cluster, local handoff: {verdict.rows} rows, {batches} batches in {took:.1f}s")
    assert batches >= 2, "the run should take several batches"
    # Every segment left the handoff only once a Delta commit held its last offset.
    assert len(watch.seen) >= PARTITIONS
    problems = released_before_durable(
        watch, table, dict.fromkeys(range(PARTITIONS), PER_PARTITION)
    )
    assert not problems, "\n".join(problems)


def test_until_end_with_segments_and_table_on_s3(
    spark_cluster: SparkCluster,
    broker: KafkaCluster,
    s3: S3Server,
    cluster_topic: str,
    group: str,
    tmp_path: Path,
) -> None:
    prefix = unique_name("cluster")
    table = f"s3://{s3.bucket}/{prefix}/table"
    handoff = f"s3://{s3.bucket}/{prefix}/handoff"
    path = cluster_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=cluster_topic,
        group=group,
        table=table,
        master=spark_cluster.master_url,
        handoff_root=handoff,
        sections={"table": {"storage_options": s3.storage_options()}},
    )
    with SegmentWatch(s3_segments(s3.filesystem(), handoff.removeprefix("s3://")), 0.2) as watch:
        took, text = run_until_end(path, tmp_path / "run.log")
    options = s3.storage_options()
    verdict = verify_exact(broker.bootstrap, cluster_topic, group, table, storage_options=options)
    verdict.raise_if_not_exact()
    assert verdict.rows == PARTITIONS * PER_PARTITION
    ran_on_the_cluster(spark_cluster, text)
    batches = text.count("event=batch_committed")
    print(f"cluster, S3 handoff and table: {verdict.rows} rows, {batches} batches in {took:.1f}s")
    # The segments were on S3, and every one was released.
    assert len(watch.seen) >= PARTITIONS, watch.errors
    assert watch.gone.keys() == watch.seen.keys()
