"""The Spark job that lands handoff segments in Delta tables.

``job.py`` (``Batch``, ``run_batch``, ``BatchResult``), ``source.py`` (the
``ingest_segments`` Python Data Source), ``decode.py`` (records to rows: types,
offset filter, value decoding). Commits go through ``ingest.sink``.
"""

from spark_jobs.job import Batch, BatchResult, run_batch

__all__ = ["Batch", "BatchResult", "run_batch"]
