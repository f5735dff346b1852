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

import base64
import datetime as dt
import json
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ingest.handoff import read_segment
from ingest.sink.files import write_data_files
from ingest.sink.storage import TableLocation
from spark_jobs.decode import DecodeSpec, decode, drop_through, spark_records

__all__ = [
    "FILES_SCHEMA",
    "ReadPlan",
    "SegmentSource",
    "SegmentTask",
    "dead_letter_name",
    "decode_plan",
    "encode_plan",
    "files_task",
]

FILES_SCHEMA = "kind string, file string"
KIND_DATA = "data"
KIND_DEAD = "dead"


@dataclass(frozen=True)
class SegmentTask:
    """Consecutive segments of one partition, and the offsets of it already landed."""

    uris: tuple[str, ...]
    topic: str
    partition: int
    skip_through: int | None  # the table's txn version
    dead_skip_through: int | None  # the dead-letter table's txn version
    rows: tuple[int, int] | None = None  # a row range of the segments' records; None: all

    def __post_init__(self) -> None:
        # A lone URI would be read as its characters: "/" first, a directory.
        if isinstance(self.uris, str):
            raise TypeError(f"SegmentTask.uris is a tuple of segment URIs, got {self.uris!r}")


@dataclass(frozen=True)
class ReadPlan:
    mode: str  # "records" or "files"
    token: str
    tasks: tuple[SegmentTask, ...]
    spec: DecodeSpec
    table: TableLocation
    dead: TableLocation
    partition_by: tuple[str, ...] = ()
    prefix: str = ""  # where data files go inside the table location
    segment_options: Mapping[str, Any] = field(default_factory=dict)
    ingest_time: dt.datetime | None = None


def encode_plan(plan: ReadPlan) -> str:
    return base64.b64encode(pickle.dumps(plan)).decode()


def decode_plan(text: str) -> ReadPlan:
    plan = pickle.loads(base64.b64decode(text))
    assert isinstance(plan, ReadPlan)
    return plan


def dead_letter_name(token: str, index: int) -> str:
    """Base name of the dead letters a records-mode task writes (``-0.parquet`` follows)."""
    return f"part-{token}-{index:05d}-dead"


def read_task(plan: ReadPlan, index: int) -> tuple[pa.Table, pa.Table]:
    """(rows, dead letters) of one task's segments, filtered and decoded."""
    task = plan.tasks[index]
    segments = [read_segment(uri, storage_options=plan.segment_options) for uri in task.uris]
    segment = segments[0] if len(segments) == 1 else pa.concat_tables(segments)
    if task.rows is not None:
        segment = segment.slice(task.rows[0], task.rows[1] - task.rows[0])
    records = drop_through(spark_records(segment), task.skip_through)
    decoded = decode(records, plan.spec, ingest_time=plan.ingest_time)
    dead = drop_through(decoded.dead, task.dead_skip_through)
    return decoded.rows, dead


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


def files_task(plan: ReadPlan, index: int) -> list[tuple[str, str]]:
    """One task of a ``files`` plan: its rows and dead letters written as Parquet,
    described as (kind, DataFile JSON) pairs. Run as an RDD task by the job (the rows
    never enter the JVM, so no SQL planning is needed), or through the data source."""
    if not plan.tasks[index].uris:
        return []
    rows, dead = read_task(plan, index)
    name = f"part-{plan.token}-{index:05d}"
    files = write_data_files(
        rows, plan.table, name=name, partition_by=plan.partition_by, prefix=plan.prefix
    )
    dead_files = write_data_files(dead, plan.dead, name=f"{name}-dead")
    return [(KIND_DATA, f.to_json()) for f in files] + [
        (KIND_DEAD, f.to_json()) for f in dead_files
    ]
