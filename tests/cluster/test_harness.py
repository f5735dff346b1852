"""``SparkCluster`` itself: a master and two workers come up, run a job's tasks on both
workers with this checkout's code, and leave no process behind when stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest.testing import SparkCluster
from ingest.testing.spark_cluster import alive, source_root

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

# A driver that runs one job of 4 tasks and holds its executors until its stdin closes.
DRIVER = """
import json, sys
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false")
    .config("spark.executor.memory", "512m").getOrCreate()
)

def where(_):
    import os, sys
    import ingest.engines
    yield [ingest.engines.__file__, sys.executable, os.getpid(), os.getcwd()]

rows = spark.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()
print(json.dumps(rows), flush=True)
sys.stdin.read()
"""


def test_the_cluster_runs_tasks_on_both_workers_and_its_stop_leaves_nothing(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    cluster = SparkCluster(2, work_dir=tmp_path / "cluster").start()
    started = time.monotonic() - began
    driver = None
    try:
        assert cluster.alive_workers() == 2
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, cluster.master_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert driver.stdout is not None
        line = driver.stdout.readline()  # bounded by the test's timeout
        assert line, "the driver ended without an answer"
        rows = json.loads(line)
        # The executors run this interpreter and this checkout's ingest.
        assert {Path(r[0]).resolve() for r in rows} == {
            source_root() / "ingest/engines/__init__.py"
        }
        assert {r[1] for r in rows} == {sys.executable}
        # Each worker ran an executor, in its own directory.
        for index in range(2):
            assert cluster.executor_pids(index), f"worker {index} has no executor"
        workers = {Path(r[3]).relative_to(tmp_path / "cluster").parts[0] for r in rows}
        assert workers == {"worker-0", "worker-1"}, rows
        pids = cluster.pids()
        python = [pid for pid in pids if pid in {r[2] for r in rows}]
        assert python, "the tasks' Python workers are not the cluster's descendants"
        stopping = time.monotonic()
        cluster.stop()
        stopped = time.monotonic() - stopping
        left = [pid for pid in pids if alive(pid)]
        assert not left, f"left running after stop: {left}"
        assert not cluster.running()
        print(f"cluster up in {started:.1f}s, stopped with its executors in {stopped:.1f}s")
    finally:
        if driver is not None:
            driver.kill()
            driver.wait(10)
        cluster.cleanup()
