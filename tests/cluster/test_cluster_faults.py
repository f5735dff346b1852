"""Faults of the Spark standalone cluster during ``ingest run --until-end``: a worker
SIGKILLed while its executor runs a task of a batch."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ingest.faults import fault_point_env
from ingest.testing import KafkaCluster, SparkCluster, verify_exact
from ingest.testing.spark_cluster import alive, descendants
from tests.cluster.support import (
    PARTITIONS,
    PER_PARTITION,
    RUN_TIMEOUT,
    cluster_config,
    run_until_end,
)
from tests.runtime.support import Cli, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

STALL = "ingest: fault point in_spark_task #1: stall"
# The run's [spark] executorless_timeout: shorter than the default 60 s, far above the few
# seconds a new application waits for its executors.
EXECUTORLESS_S = 20
# How long the first batch is held before its commit: long enough for the master to restart
# and the old executors to go (the test fails if batch 1 commits before they are gone).
STALL_S = 45


def stalled_executor(cluster: SparkCluster, index: int) -> bool:
    """An executor of worker ``index`` has a task held at the ``in_spark_task`` point (its
    Python worker's stderr is the executor's, in the worker's directory)."""
    work = cluster.work_dir / f"worker-{index}" / "work"
    return any(STALL in log.read_text(errors="replace") for log in work.glob("app-*/*/stderr"))


def committed_files(table: Path) -> list[str]:
    """The path of every add action in the table's log."""
    paths: list[str] = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                paths.append(action["add"]["path"])
    return paths


def test_a_worker_killed_mid_batch_has_its_tasks_retried_and_the_table_exact(
    spark_cluster: SparkCluster,
    broker: KafkaCluster,
    cluster_topic: str,
    group: str,
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    path = cluster_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=cluster_topic,
        group=group,
        table=str(table),
        master=spark_cluster.master_url,
        handoff_root=str(tmp_path / "handoff"),
        # Each Python worker's first task of a batch waits 8 s with its segments read and
        # its files not written: the moment the worker is killed.
        sections={
            "spark": {"conf": {"spark.executorEnv.INGEST_FAULT_POINT": "in_spark_task:1:stall=8"}}
        },
    )
    began = time.monotonic()
    cli = Cli(["run", "-c", str(path), "--until-end"], tmp_path / "run.log")
    try:
        wait_until(lambda: stalled_executor(spark_cluster, 0), 120, "a task held on worker 0")
        held = time.monotonic() - began
        worker = spark_cluster.workers[0].pid
        assert worker is not None
        executors = descendants(worker)  # the executor JVM, its Python daemon and workers
        assert spark_cluster.executor_pids(0)
        spark_cluster.kill_worker(0)
        # The executor notices its worker is gone and exits, its Python with it: nothing
        # of worker 0 reads a segment or writes a file from now on.
        gone = wait_until(
            lambda: not any(alive(pid) for pid in executors),
            30,
            "worker 0's executor and its Python processes to exit",
        )
        code = cli.wait(RUN_TIMEOUT)
    finally:
        cli.kill()
        if not spark_cluster.workers[0].running():
            spark_cluster.restart_worker(0)  # the session's cluster whole again
    took = time.monotonic() - began
    text = cli.text()
    assert code == 0, text[-6000:]
    verdict = verify_exact(broker.bootstrap, cluster_topic, group, str(table))
    verdict.raise_if_not_exact()
    assert verdict.rows == PARTITIONS * PER_PARTITION
    # Spark saw the executor go (its running tasks are resubmitted, logged at INFO only);
    # the held task's rows are in the table, so another attempt wrote them.
    assert "Lost executor" in text and "worker lost" in text
    files = committed_files(table)
    assert len(files) == len(set(files)), "a file was committed twice"
    print(
        f"worker killed {held:.1f}s into the run, its executor gone {gone:.1f}s later; "
        f"run {took:.1f}s, {verdict.rows} rows in {len(files)} files"
    )


@pytest.mark.timeout(480)
def test_a_master_restarted_between_batches_fails_the_run_clearly_and_a_rerun_is_exact(
    spark_cluster: SparkCluster,
    broker: KafkaCluster,
    cluster_topic: str,
    group: str,
    tmp_path: Path,
) -> None:
    """A restarted master forgets the application and kills its executors; the driver would
    wait for it forever. The next batch fails after [spark] executorless_timeout, nothing of it
    committed, and the run exits 1 saying why; a rerun (a new application) lands the rest."""
    table = tmp_path / "table"
    path = cluster_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=cluster_topic,
        group=group,
        table=str(table),
        master=spark_cluster.master_url,
        handoff_root=str(tmp_path / "handoff"),
        sections={"spark": {"executorless_timeout": f"{EXECUTORLESS_S}s"}},
    )
    began = time.monotonic()
    cli = Cli(
        ["run", "-c", str(path), "--until-end"],
        tmp_path / "run.log",
        env=fault_point_env("before_delta_commit", 1, stall=STALL_S),
    )
    try:
        wait_until(
            lambda: "fault point before_delta_commit #1: stall" in cli.text(),
            120,
            "the first batch held before its commit",
        )
        spark_cluster.stop_master()
        restarted = spark_cluster.start_master()
        wait_until(lambda: spark_cluster.alive_workers() == 2, 60, "the workers to re-register")
        # The re-registered workers kill the forgotten application's executors, each some
        # seconds after the other (measured: 2 s apart, the second after a 15 s stall had
        # ended, so the next batch ran on it and committed): batch 2 must start after both.
        wait_until(
            lambda: not any(spark_cluster.executor_pids(i) for i in range(2)),
            60,
            "the old application's executors to be killed",
        )
        assert "event=batch_committed batch=1 " not in cli.text(), "the stall ended too soon"
        code = cli.wait(EXECUTORLESS_S + 120)
    finally:
        cli.kill()
    failed_after = time.monotonic() - began
    text = cli.text()
    assert code == 1, text[-6000:]
    assert "no Spark executor for" in text and spark_cluster.master_url in text, text[-6000:]
    assert "event=batch_committed batch=1 " in text  # the held batch needed no executor
    assert "event=batch_committed batch=2 " not in text
    partial = verify_exact(
        broker.bootstrap, cluster_topic, group, str(table), require_complete=False
    )
    partial.raise_if_not_exact()
    assert 0 < partial.rows < PARTITIONS * PER_PARTITION
    took, _ = run_until_end(path, tmp_path / "rerun.log")
    verdict = verify_exact(broker.bootstrap, cluster_topic, group, str(table))
    verdict.raise_if_not_exact()
    assert verdict.rows == PARTITIONS * PER_PARTITION
    print(
        f"master restarted in {restarted:.1f}s; the run failed {failed_after:.1f}s after its "
        f"start with {partial.rows} rows landed; the rerun landed the rest in {took:.1f}s"
    )
