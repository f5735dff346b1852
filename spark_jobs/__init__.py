"""The Spark job that lands handoff segments in Delta tables.

``job.py`` (``run_batch``, and ``SparkFiles``: the writer the landing protocol
``ingest.sink.land`` is run with; ``Batch`` and ``BatchResult`` are the sink's),
``tasks.py`` (a batch's segments cut into Spark tasks), ``source.py`` (the
``ingest_segments`` Python Data Source), ``decode.py`` (records to rows: types,
offset filter, value decoding), ``daemon.py`` (Spark's Python daemon with the
tasks' imports done before it forks). Commits go through ``ingest.sink``.

The names below load lazily: ``python -m spark_jobs.daemon`` must run before
anything imports pyspark.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Batch", "BatchResult", "run_batch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spark_jobs import job

        return getattr(job, name)
    raise AttributeError(f"module 'spark_jobs' has no attribute {name!r}")
