"""A batch's Spark tasks as plain data, and the task that writes files (no pyspark here).

A ``ReadPlan`` says what each task reads (a run of a Kafka partition's consecutive
segments, or a row range of them: ``tasks.group_segments``), what the table already holds
(the txn versions, so those offsets are dropped), how values decode, and where files go.
``files_task`` runs one task of a ``files`` plan: its rows and dead letters written as
Parquet with pyarrow straight into the table's location, described as (kind, DataFile
JSON) pairs, and a ``columns`` pair when a writer's schema added columns (the Arrow
schema of those, ``added_schema``). Spark runs it as an RDD task (``job.py``), the local engine in a process of
its own pool (``local/task_pool.py``), the Python Data Source reads plans too (``spark/python_worker/segment_source.py``).

File names carry the plan token and the task index, so a retried task overwrites its own
files.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.errors import IncompatibleSchemaError
from ingest.faults import fault_point
from ingest.formats.decode import DecodeSpec, added_columns, decode, drop_through, spark_records
from ingest.handoff import read_segment
from ingest.sink.files import DataFile, write_data_files
from ingest.sink.metadata.mapping import ColumnMapping
from ingest.sink.storage import TableLocation

if TYPE_CHECKING:  # the landing protocol's types; a task process never imports it
    from ingest.sink.batch import WriteRequest
    from ingest.sink.deadletter import Rejected

__all__ = [
    "FILES_SCHEMA",
    "KIND_COLUMNS",
    "KIND_DATA",
    "KIND_DEAD",
    "ReadPlan",
    "SegmentTask",
    "added_schema",
    "collect_rows",
    "dead_letter_name",
    "decode_plan",
    "encode_plan",
    "files_task",
    "read_task",
]

FILES_SCHEMA = "kind string, file string"
KIND_DATA = "data"
KIND_DEAD = "dead"
KIND_COLUMNS = "columns"


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
    # Each segment's (size, checksum) by URI, checked before it is read.
    checks: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)
    mapping: ColumnMapping | None = None  # the table's column mapping (physical names)

    @classmethod
    def files(
        cls, request: WriteRequest, tasks: tuple[SegmentTask, ...], spec: DecodeSpec
    ) -> ReadPlan:
        """A ``files`` plan for one write of the landing protocol."""
        return cls(
            mode="files",
            token=request.token,
            tasks=tasks,
            spec=spec,
            table=request.table,
            dead=request.dead,
            partition_by=request.partition_by,
            prefix=request.prefix,
            segment_options=request.segment_options,
            ingest_time=request.ingest_time,
            checks={s.uri: (s.bytes, s.checksum) for s in request.segments},
            mapping=request.mapping,
        )


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
    segments = [
        read_segment(uri, storage_options=plan.segment_options, expect=plan.checks.get(uri))
        for uri in task.uris
    ]
    segment = segments[0] if len(segments) == 1 else pa.concat_tables(segments)
    if task.rows is not None:
        segment = segment.slice(task.rows[0], task.rows[1] - task.rows[0])
    records = drop_through(spark_records(segment), task.skip_through)
    decoded = decode(records, plan.spec, ingest_time=plan.ingest_time)
    dead = drop_through(decoded.dead, task.dead_skip_through)
    return decoded.rows, dead


def files_task(plan: ReadPlan, index: int) -> list[tuple[str, str]]:
    """One task of a ``files`` plan: its rows and dead letters written as Parquet,
    described as (kind, DataFile JSON) pairs. Run as an RDD task by the job (the rows
    never enter the JVM, so no SQL planning is needed), or through the data source."""
    if not plan.tasks[index].uris:
        return []
    rows, dead = read_task(plan, index)
    # Fault injection (a no-op unless INGEST_FAULT_POINT is set; ingest/faults.py).
    fault_point("in_spark_task")
    name = f"part-{plan.token}-{index:05d}"
    files = write_data_files(
        rows,
        plan.table,
        name=name,
        partition_by=plan.partition_by,
        prefix=plan.prefix,
        mapping=plan.mapping,
    )
    dead_files = write_data_files(dead, plan.dead, name=f"{name}-dead")
    added = added_columns(rows.schema, plan.spec)
    columns = [(KIND_COLUMNS, _schema_text(pa.schema(added)))] if added and files else []
    return (
        [(KIND_DATA, f.to_json()) for f in files]
        + [(KIND_DEAD, f.to_json()) for f in dead_files]
        + columns
    )


def _schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def added_schema(rows: Iterable[tuple[str, str]], base: pa.Schema) -> pa.Schema:
    """``base`` and, after it, the columns the tasks' ``columns`` rows add (one type per
    name: two writers' schemas that add one column with two types are refused)."""
    fields = {field.name: field for field in base}
    for kind, text in rows:
        if kind != KIND_COLUMNS:
            continue
        for added in pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))):
            known = fields.setdefault(added.name, added)
            if known.type != added.type:
                raise IncompatibleSchemaError(
                    f"two writers' schemas give column {added.name!r} two types: "
                    f"{known.type} and {added.type}"
                )
    return pa.schema(list(fields.values()))


def collect_rows(
    rows: Iterable[tuple[str, str]],
) -> tuple[list[DataFile], list[DataFile], list[Rejected]]:
    """The (kind, text) rows tasks return, as data files, dead-letter files and the rows a
    transform rejected (topic, partition, offset, reason)."""
    data: list[DataFile] = []
    dead: list[DataFile] = []
    rejected: list[Rejected] = []
    for kind, text in rows:
        if kind == KIND_DATA:
            data.append(DataFile.from_json(text))
        elif kind == KIND_DEAD:
            dead.append(DataFile.from_json(text))
        elif kind != KIND_COLUMNS:  # added columns: ``added_schema``
            topic, partition, offset, message = json.loads(text)
            rejected.append((topic, int(partition), int(offset), message))
    return data, dead, rejected
