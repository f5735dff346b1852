"""A local Spark session configured the way ingest's jobs and tests need it: Delta Lake's
extensions and catalog, and S3A (``ingest.spark_env``), as the supervisor's sessions."""

from __future__ import annotations

import os
import sys
from typing import Any

from ingest.spark_env import session_settings


def local_spark_session(
    master: str = "local[2]",
    app_name: str = "ingest-tests",
    extra_conf: dict[str, str] | None = None,
) -> Any:
    """Starts (or returns) the process's Spark session: UI off, our Python for workers.

    Workers must run this interpreter, or they start the system Python and fail
    to import pyarrow (docs/test-servers.md). S3A has no endpoint until a test gives one
    (``extra_conf`` from ``ingest.spark_env.s3a_settings``, or ``spark.conf.set`` of the
    ``fs.s3a.*`` keys at run time, which reads and writes see).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        # A test table's log is small: its snapshot in one task, not Delta's 50 (each
        # Delta Spark statement rebuilds one; 50 tasks took seconds each on 2 cores).
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        # Spark 4 writes INT96 timestamps by default; Delta readers want micros.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.driver.memory", "1g")
        # As in production (ingest.engines.spark.spark_session): see ingest/engines/spark/python_worker/daemon.py.
        .config("spark.python.daemon.module", "ingest.engines.spark.python_worker.daemon")
    )
    for key, value in {**session_settings(), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
