"""The Spark job: one batch of segments into one Delta table, exactly once.

``run_batch(spark, batch) -> BatchResult`` runs the landing protocol
(``ingest.sink.land``: txn versions, dead letters first, then the table, orphan
cleanup) with ``SparkFiles`` as its writer. This module only plans the Spark
tasks (``tasks.group_segments``), runs them and hands back the files they wrote:

* without a SQL transform the rows never enter the JVM (the ``arrow`` path: an
  RDD job whose tasks read the segments and write the table's files with
  pyarrow, ``source.files_task``);
* with one, the decoded rows are the view ``batch`` (the ``ingest_segments``
  data source in ``records`` mode); the transform's result is written by
  ``mapInArrow`` tasks with the same writer (the ``spark`` path), which also
  reports the rows the transform marked in ``_dead_letter``.

Paths, measured (``scripts/bench/sink.py --repeat 3``: 1M records of 100-byte
values in 4 segments, warm local[2] session, 2 shared cores; best of 3, range)::

    job, no transform: arrow path (tasks write Parquet with pyarrow)    0.53 s (0.53-0.63)
    job, rows through the JVM (records source, SELECT *, mapInArrow)    1.9 s  (1.9-3.0)
    same rows, Spark's own Parquet writer (no stats, listing, commit)   1.5 s  (1.5-4.4)
    deltalake.write_deltalake of the same Arrow table                   0.52 s (0.52-1.2)
    spark.createDataFrame(arrow).write.parquet                          4.7 s  (4.7-6.3)

So without a transform the job takes the arrow path (as fast as delta-rs
writing the table itself). With one, the rows must cross into the JVM; the
transform's output is written by ``mapInArrow`` tasks with the arrow path's
writer although Spark's own writer is ~0.4 s faster on 1M rows: one pass
splits off the ``_dead_letter`` rows, every file gets Delta statistics and its
offset provenance (needed to re-filter after a lost race), no listing is
needed, and it writes to object stores through the same pyarrow filesystem the
driver checks files with (Spark's S3A would be a second client with its own
settings to keep in step). The transform reads other Delta tables by path
(``delta.`uri```), by name in the session catalog, or as the views
``table.transform_tables`` names. A transform must read every row (no LIMIT): rows Spark never reads
would be neither written nor dead-lettered, yet the txn moves past them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.engines.drive import drive_landing
from ingest.engines.plan import (
    FILES_SCHEMA,
    KIND_DATA,
    ReadPlan,
    SegmentTask,
    added_schema,
    collect_rows,
    dead_letter_name,
    encode_plan,
)
from ingest.engines.tasks import group_segments
from ingest.errors import ConfigError
from ingest.formats.decode import DecodeSpec, table_spec
from ingest.sink.batch import Batch, BatchResult, WriteRequest, WrittenFiles
from ingest.sink.deadletter import Rejected
from ingest.sink.files import DataFile, read_data_file_footer, write_data_files
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DEAD_LETTER_COLUMN, DELETE_COLUMN, FIELD_FORMATS, TableConfig

__all__ = [
    "Batch",
    "BatchResult",
    "SparkFiles",
    "decode_spec",
    "run_batch",
    "table_schema",
    "warm_up",
]

_KIND_TRANSFORM_DEAD = "transform-dead"


def decode_spec(spark: Any, config: TableConfig) -> DecodeSpec:
    """The decode spec of a table; a value schema is Spark DDL, parsed by Spark."""
    json_schema = None
    if config.value_format in FIELD_FORMATS and config.value_schema:
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        try:
            struct = StructType.fromDDL(config.value_schema or "")
        except Exception as exc:
            raise ConfigError(f"not a Spark DDL schema: {exc}", key="table.value.schema") from exc
        if not isinstance(struct, StructType):
            raise ConfigError("must list fields: 'name TYPE, ...'", key="table.value.schema")
        json_schema = to_arrow_schema(struct, timezone="UTC")
    return table_spec(config, json_schema)


_REGISTERED: set[int] = set()


def _segment_source() -> Any:
    """The Python data source (for a transform): imported here, not with this module, so
    a batch on the local engine does not import pyspark (~60 ms at its first batch)."""
    from ingest.engines.spark.python_worker.segment_source import SegmentSource

    return SegmentSource


def _register(spark: Any) -> None:
    if id(spark) not in _REGISTERED:
        spark.dataSource.register(_segment_source())
        _REGISTERED.add(id(spark))


def _run_files_tasks(spark: Any, plan: ReadPlan) -> list[tuple[str, str]]:
    """The plan's tasks as one RDD job, a Spark partition each."""
    count = len(plan.tasks)
    encoded = encode_plan(plan)

    def run(indexes: Iterator[int]) -> Iterator[tuple[str, str]]:
        from ingest.engines.spark.python_worker.segment_source import decode_plan, files_task

        task_plan = decode_plan(encoded)
        for index in indexes:
            yield from files_task(task_plan, index)

    result: list[tuple[str, str]] = (
        spark.sparkContext.parallelize(range(count), count).mapPartitions(run).collect()
    )
    return result


def warm_up(spark: Any, *, transform: bool = False) -> float:
    """An empty job with a task per core, the way batches will run, so the first batch
    does not pay for the Python workers' start and imports (pyarrow, the decoder, the
    writer) nor, with a transform, for the data source's registration and planning.
    Seconds."""
    began = time.perf_counter()
    cores = _parallelism(spark)
    nowhere = TableLocation.of("/nonexistent/ingest-warm-up")
    plan = ReadPlan(
        mode="files",
        token="warm-up",
        tasks=tuple(SegmentTask((), "", 0, None, None) for _ in range(cores)),
        spec=DecodeSpec(),
        table=nowhere,
        dead=nowhere,
    )
    _run_files_tasks(spark, plan)
    if transform:
        _register(spark)
        spark.read.format(_segment_source().name()).option(
            "plan", encode_plan(plan)
        ).load().collect()
    return time.perf_counter() - began


def run_batch(spark: Any, batch: Batch, *, path: str | None = None) -> BatchResult:
    """Lands ``batch`` in its table (``ingest.sink.land``) with Spark tasks writing the
    files. ``path`` forces "arrow" or "spark" (measurements and tests); by default a
    transform takes the spark path and everything else the arrow path."""
    config = batch.table
    if path is None:
        path = "spark" if config.transform else "arrow"
    if path not in ("arrow", "spark"):
        raise ValueError(f"path must be arrow or spark, not {path!r}")
    if config.transform and path == "arrow":
        raise ValueError("a transform needs the spark path")
    return drive_landing(batch, SparkFiles(spark, config, decode_spec(spark, config), path).write)


class SparkFiles:
    """The landing's writes (``ingest.engines.drive``): the batch's tasks on a Spark session."""

    def __init__(self, spark: Any, config: TableConfig, spec: DecodeSpec, path: str) -> None:
        self.spark = spark
        self.config = config
        self.spec = spec
        self.path = path

    def write(self, request: WriteRequest) -> WrittenFiles:
        return self.plan(request)()

    def plan(self, request: WriteRequest) -> Callable[[], WrittenFiles]:
        tasks = group_segments(
            request.segments,
            skip_through=request.skip_through,
            dead_skip_through=request.dead_skip_through,
            parallelism=_parallelism(self.spark) if request.segments else 1,
        )
        plan = ReadPlan.files(request, tasks, self.spec)
        return lambda: self._run(plan)

    def _run(self, plan: ReadPlan) -> WrittenFiles:
        data: list[DataFile] = []
        dead: list[DataFile] = []
        rejected: list[Rejected] = []
        schema = self.spec.output_schema()
        if plan.tasks:
            if self.path == "arrow":
                rows = _run_files_tasks(self.spark, plan)
                schema = added_schema(rows, schema)  # a writer's schema added columns
            else:
                _register(self.spark)  # ~1 s the first time; the arrow path needs no data source
                rows, schema = _transform(self.spark, self.config, plan, self.spec)
            try:
                data, dead, rejected = collect_rows(rows)
                if self.path == "spark":
                    names = [
                        f"{dead_letter_name(plan.token, i)}-0.parquet"
                        for i in range(len(plan.tasks))
                    ]
                    dead.extend(read_data_file_footer(plan.dead, names))
            except BaseException:
                # Never handed over: the landing protocol cannot delete what it never got.
                plan.table.delete(f.path for f in data)
                plan.dead.delete(f.path for f in dead)
                raise
        elif self.config.transform:
            schema = _transform_schema(self.spark, self.spec, self.config)
        return WrittenFiles(
            data=tuple(data),
            dead=tuple(dead),
            rejected=tuple(rejected),
            schema=schema,
            path=self.path if plan.tasks else "none",
        )


def _parallelism(spark: Any) -> int:
    try:
        return max(int(spark.sparkContext.defaultParallelism), 1)
    except Exception:  # a Spark Connect session has no sparkContext
        return 2


# -- the spark path ---------------------------------------------------------------------------


def _spark_schema(arrow_schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False)


def _arrow_schema(struct: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def _batch_view(spark: Any, plan: ReadPlan, spec: DecodeSpec) -> Any:
    records_plan = ReadPlan(**{**plan.__dict__, "mode": "records"})
    frame = (
        spark.read.format(_segment_source().name())
        .option("plan", encode_plan(records_plan))
        .option("schema", _spark_schema(spec.output_schema()).json())
        .load()
    )
    frame.createOrReplaceTempView("batch")
    return frame


def _transform_schema(spark: Any, spec: DecodeSpec, config: TableConfig) -> pa.Schema:
    empty = spark.createDataFrame([], _spark_schema(spec.output_schema()))
    empty.createOrReplaceTempView("batch")
    out = _sql(spark, config)
    return _arrow_schema(out.drop(DEAD_LETTER_COLUMN).schema)


def table_schema(spark: Any, config: TableConfig) -> pa.Schema:
    """The columns a batch of ``config``'s table lands, known before any batch: the
    decoded values', or the transform's over an empty ``batch`` view; never ``_delete``
    (a table by name is created with them before its first batch: ``catalog.py``)."""
    spec = decode_spec(spark, config)
    schema = _transform_schema(spark, spec, config) if config.transform else spec.output_schema()
    if DELETE_COLUMN in schema.names:
        schema = schema.remove(schema.get_field_index(DELETE_COLUMN))
    return schema


def _table_views(spark: Any, config: TableConfig) -> None:
    """The Delta tables the transform names (``table.transform_tables``), as temporary
    views: a view keeps its SQL, so each batch reads the table's latest version."""
    for name, uri in config.transform_tables.items():
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {name} AS SELECT * FROM delta.`{uri}`")


def _sql(spark: Any, config: TableConfig) -> Any:
    try:
        _table_views(spark, config)
        # Forced onto the spark path without a transform: the rows as they are.
        out = spark.sql(config.transform or "SELECT * FROM batch")
    except Exception as exc:
        raise ConfigError(f"the transform does not run: {exc}", key="table.transform") from exc
    columns = set(out.columns)
    needed: list[str] = []
    if DEAD_LETTER_COLUMN in columns:
        needed += ["topic", "partition", "offset"]
    if config.mode == "upsert":
        needed += [*config.merge_keys, "topic", "partition", "offset"]
    if config.deletes:
        # Without it tombstones and change events would stop deleting, silently.
        needed.append(DELETE_COLUMN)
    missing = sorted({c for c in needed if c not in columns})
    if missing:
        hint = (
            f" ({DELETE_COLUMN} marks the rows that delete their key; to have none, set "
            'table.tombstones = "ignore" or "dead_letter")'
            if DELETE_COLUMN in missing
            else ""
        )
        raise ConfigError(
            f"the transform's output must keep the columns {missing}{hint}",
            key="table.transform",
        )
    return out


def _transform(
    spark: Any, config: TableConfig, plan: ReadPlan, spec: DecodeSpec
) -> tuple[list[Any], pa.Schema]:
    _batch_view(spark, plan, spec)
    out = _sql(spark, config)
    schema = _arrow_schema(out.drop(DEAD_LETTER_COLUMN).schema)
    writer = _ArrowWriter(plan)
    rows = out.mapInArrow(writer, FILES_SCHEMA).collect()
    return rows, schema


class _ArrowWriter:
    """The mapInArrow function that writes a transform's output as data files."""

    def __init__(self, plan: ReadPlan) -> None:
        self.location = plan.table
        self.token = plan.token
        self.partition_by = plan.partition_by
        self.prefix = plan.prefix
        self.mapping = plan.mapping

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        index = context.partitionId() if context is not None else 0
        collected = list(batches)
        if not collected:
            return
        table = pa.Table.from_batches(collected)
        kinds: list[str] = []
        texts: list[str] = []
        if DEAD_LETTER_COLUMN in table.column_names:
            marks = table.column(DEAD_LETTER_COLUMN)
            rejected = marks.is_valid()
            if pc.any(rejected).as_py():
                bad = table.filter(rejected)
                for topic, partition, offset, message in zip(
                    bad.column("topic").to_pylist(),
                    bad.column("partition").to_pylist(),
                    bad.column("offset").to_pylist(),
                    bad.column(DEAD_LETTER_COLUMN).to_pylist(),
                    strict=True,
                ):
                    kinds.append(_KIND_TRANSFORM_DEAD)
                    texts.append(json.dumps([topic, partition, offset, message]))
                table = table.filter(pc.invert(rejected))
            table = table.drop_columns([DEAD_LETTER_COLUMN])
        files = write_data_files(
            table,
            self.location,
            name=f"part-{self.token}-t{index:05d}",
            partition_by=self.partition_by,
            prefix=self.prefix,
            mapping=self.mapping,
        )
        for data_file in files:
            kinds.append(KIND_DATA)
            texts.append(data_file.to_json())
        if kinds:
            yield pa.RecordBatch.from_arrays(
                [pa.array(kinds, pa.string()), pa.array(texts, pa.string())], names=["kind", "file"]
            )
