"""The Python Data Source over handoff segments: one input partition per task, a run of
consecutive segments of one Kafka partition, or a row range of them
(``tasks.group_segments``).

``spark.read.format("ingest_segments").option("plan", encode_plan(plan)).load()``.
Each task reads its segments (memory-mapped when local), drops the offsets the
table already holds, decodes the values and then, by the plan's ``mode``:

* ``records``: yields the decoded rows as Arrow batches (types exactly as the
  declared schema; Spark refuses ``timestamp[ms]``, hence the casts in
  ``decode.spark_records``). The rows cross into the JVM: the path for a SQL
  transform. Dead letters are written by the task into the dead-letter
  table's location under a name derived from the plan token and the task, and
  the driver finds them there after the job (``dead_letter_path``).
* ``files``: writes the rows as Parquet with pyarrow straight into the table's
  location (or the upsert staging prefix) and yields one small row per file
  (``kind``, ``file``: a ``DataFile`` as JSON). No record enters the JVM. The job
  runs these tasks as a plain RDD job (``files_task``): a cold process's first
  read through a Python data source costs ~8 s of planning, an RDD job ~2.4 s.

File names carry the plan token and the task index, so a retried task
overwrites its own files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ingest.engines.plan import (
    FILES_SCHEMA,
    KIND_DATA,
    KIND_DEAD,
    ReadPlan,
    SegmentTask,
    dead_letter_name,
    decode_plan,
    encode_plan,
    files_task,
    read_task,
)
from ingest.sink.files import write_data_files

__all__ = [
    "FILES_SCHEMA",
    "KIND_DATA",
    "KIND_DEAD",
    "ReadPlan",
    "SegmentSource",
    "SegmentTask",
    "dead_letter_name",
    "decode_plan",
    "encode_plan",
    "files_task",
    "read_task",
]


class SegmentSource(DataSource):
    """Registered as ``ingest_segments``; options ``plan`` and ``schema`` (JSON)."""

    @classmethod
    def name(cls) -> str:
        return "ingest_segments"

    def schema(self) -> StructType | str:
        plan = decode_plan(self.options["plan"])
        if plan.mode == "files":
            return FILES_SCHEMA
        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema: StructType) -> DataSourceReader:
        return SegmentReader(decode_plan(self.options["plan"]))


class SegmentReader(DataSourceReader):
    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(len(self.plan.tasks))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan = self.plan
        index = int(partition.value)
        if not plan.tasks[index].uris:
            return  # a warm-up task: the worker is up with this module imported
        if plan.mode == "files":
            yield from files_task(plan, index)
            return
        rows, dead = read_task(plan, index)
        write_data_files(dead, plan.dead, name=dead_letter_name(plan.token, index))
        yield from rows.to_batches(max_chunksize=64 * 1024)
