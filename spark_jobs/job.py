"""The Spark job: one batch of segments into one Delta table, exactly once.

``run_batch(spark, batch) -> BatchResult``. Steps (each timed in
``BatchResult.stage_seconds``):

1. ``plan``: read the txn version of every source partition from the table
   and from the dead-letter table; segments whose records are all at or below
   the table's version are skipped, the rest become one Spark task each.
2. ``spark``: the tasks read, filter, decode and write Parquet (see
   ``source.py``). Without a SQL transform the rows never enter the JVM (the
   ``arrow`` path: an RDD job whose tasks write the table's files with pyarrow). With one, the
   decoded rows are the view ``batch``; the transform's result is written by
   ``mapInArrow`` tasks with the same writer (the ``spark`` path).
3. ``dead_letters``: corrupt batches (their raw bytes), rows the transform
   marked in ``_dead_letter``, rows of an upsert without a merge key, and the
   decode failures the tasks wrote are committed to the dead-letter table FIRST,
   in one transaction carrying the batch's txn actions (same app ids).
4. ``commit``: the data files and the txn actions in ONE transaction on the
   table (append), or a MERGE with them (upsert). This commit makes the batch
   durable: the supervisor commits Kafka offsets only after it.

Dead-letter guarantee. delta-rs commits one table per transaction, so the two
tables cannot change atomically together. The order makes it exact anyway:
every dead letter of offsets up to the table's txn version V is in the
dead-letter table, because its commit came before the table's. A crash between
the two commits leaves dead letters whose good rows are not yet in the table;
the replay re-reads the same segments, the dead-letter table's own txn versions
drop the dead letters it already holds, and the table's commit completes the
batch. So each bad record lands once in the dead-letter table, each good one
once in the table (replays under the same configuration decode alike), and
Kafka offsets move only past both. The dead-letter table is committed only for
batches that have dead letters; its txn version for a partition therefore
means "every dead letter up to here is in", never "the batch is durable".

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
needed, and it writes to object stores, which this Spark cannot (it ships no
S3A jars). A transform must read every row (no LIMIT): rows Spark never reads
would be neither written nor dead-lettered, yet the txn moves past them.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from ingest.errors import ConfigError, SinkError
from ingest.faults import fault_point
from ingest.handoff import CorruptRangeReported, SegmentSealed, read_segment
from ingest.sink.config import DEAD_LETTER_COLUMN, TableConfig
from ingest.sink.deadletter import (
    DEAD_LETTER_SCHEMA,
    STAGE_DECODE,
    STAGE_TRANSFORM,
    corrupt_dead_letters,
    dead_letters,
)
from ingest.sink.delta import CommitOutcome, DeltaTarget, StaleBatchError
from ingest.sink.files import DataFile, read_data_file_footer, write_data_files
from ingest.sink.merge import null_key_rows, upsert
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id
from spark_jobs.decode import DecodeSpec, spark_records
from spark_jobs.source import (
    FILES_SCHEMA,
    KIND_DATA,
    KIND_DEAD,
    ReadPlan,
    SegmentSource,
    SegmentTask,
    dead_letter_name,
    encode_plan,
)

__all__ = ["Batch", "BatchResult", "group_segments", "run_batch", "warm_up"]

log = logging.getLogger("ingest.sink")

PartitionKey = tuple[str, int]
STAGING = "_ingest_staging"
_KIND_TRANSFORM_DEAD = "transform-dead"
_STALE_ATTEMPTS = 5
# A task's segments: at least this much (fewer, larger files), at most that much (memory).
_MIN_TASK_BYTES = 8 << 20
_MAX_TASK_BYTES = 128 << 20
# What a task costs besides its rows, in bytes of segment (~30 ms at ~70 MB/s per core).
_TASK_COST_BYTES = 2 << 20


@dataclass(frozen=True)
class Batch:
    """What one run of the job lands: sealed segments and corrupt ranges of one or
    more partitions, into one table. ``segment_storage_options`` are the
    handoff's pyarrow options for segments on an object store."""

    table: TableConfig
    segments: tuple[SegmentSealed, ...]
    corrupt: tuple[CorruptRangeReported, ...] = ()
    segment_storage_options: Mapping[str, Any] = field(default_factory=dict)
    # Replace the rows the tables hold in the batch's offset ranges (replay --overwrite)
    # instead of skipping the offsets they already hold.
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "corrupt", tuple(self.corrupt))

    def partitions(self) -> list[PartitionKey]:
        keys = {(s.topic, s.partition) for s in self.segments}
        keys |= {(c.topic, c.partition) for c in self.corrupt}
        return sorted(keys)

    def offset_ranges(self) -> dict[PartitionKey, tuple[int, int]]:
        """The first and last offset the batch accounts for, per partition."""
        first: dict[PartitionKey, int] = {}
        for s in self.segments:
            key = (s.topic, s.partition)
            first[key] = min(first.get(key, s.from_offset), s.from_offset)
        for c in self.corrupt:
            key = (c.topic, c.partition)
            first[key] = min(first.get(key, c.first_offset), c.first_offset)
        last = self.last_offsets()
        return {key: (first[key], last[key]) for key in first}

    def last_offsets(self) -> dict[PartitionKey, int]:
        """The last offset the batch accounts for, per partition (its txn version)."""
        last: dict[PartitionKey, int] = {}
        for s in self.segments:
            key = (s.topic, s.partition)
            last[key] = max(last.get(key, -1), s.next_offset - 1)
        for c in self.corrupt:
            key = (c.topic, c.partition)
            end = c.first_offset if c.last_offset is None else c.last_offset
            last[key] = max(last.get(key, -1), end)
        return last


@dataclass(frozen=True)
class BatchResult:
    """What the batch did. ``durable_offsets``: per partition, the highest offset the
    table's txn versions now cover (None: nothing of it landed yet)."""

    table_version: int | None
    dead_letter_version: int | None
    durable_offsets: Mapping[PartitionKey, int | None]
    rows_written: int
    dead_letters: int
    stage_seconds: Mapping[str, float]
    path: str  # "arrow", "spark" or "none"
    files: int = 0
    attempts: int = 1
    replaced_rows: int = 0  # rows of the table an overwrite took out


class _Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - since
        return now

    def done(self) -> dict[str, float]:
        self.seconds["total"] = time.perf_counter() - self._start
        return dict(self.seconds)


def decode_spec(spark: Any, config: TableConfig) -> DecodeSpec:
    """The decode spec of a table; a JSON schema is Spark DDL, parsed by Spark."""
    json_schema = None
    if config.value_format == "json":
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        try:
            struct = StructType.fromDDL(config.value_schema or "")
        except Exception as exc:
            raise ConfigError(f"not a Spark DDL schema: {exc}", key="table.value_schema") from exc
        if not isinstance(struct, StructType):
            raise ConfigError("must list fields: 'name TYPE, ...'", key="table.value_schema")
        json_schema = to_arrow_schema(struct, timezone="UTC")
    return DecodeSpec(config.value_format, json_schema, config.date_column)


_REGISTERED: set[int] = set()


def _register(spark: Any) -> None:
    if id(spark) not in _REGISTERED:
        spark.dataSource.register(SegmentSource)
        _REGISTERED.add(id(spark))


def _run_files_tasks(spark: Any, plan: ReadPlan) -> list[tuple[str, str]]:
    """The plan's tasks as one RDD job, a Spark partition each."""
    count = len(plan.tasks)
    encoded = encode_plan(plan)

    def run(indexes: Iterator[int]) -> Iterator[tuple[str, str]]:
        from spark_jobs.source import decode_plan, files_task

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
        spark.read.format(SegmentSource.name()).option("plan", encode_plan(plan)).load().collect()
    return time.perf_counter() - began


def run_batch(spark: Any, batch: Batch, *, path: str | None = None) -> BatchResult:
    """Lands ``batch`` in its table (see the module docstring). ``path`` forces
    "arrow" or "spark" (measurements and tests); by default a transform takes
    the spark path and everything else the arrow path."""
    config = batch.table
    if path is None:
        path = "spark" if config.transform else "arrow"
    if path not in ("arrow", "spark"):
        raise ValueError(f"path must be arrow or spark, not {path!r}")
    if config.transform and path == "arrow":
        raise ValueError("a transform needs the spark path")
    spec = decode_spec(spark, config)
    for attempt in range(1, _STALE_ATTEMPTS + 1):
        try:
            result = _run_once(spark, batch, spec, path)
        except StaleBatchError as exc:
            log.info("%s: redoing the batch: %s", config.uri, exc)
            continue
        return BatchResult(**{**result.__dict__, "attempts": attempt})
    raise SinkError(f"{config.uri}: the batch went stale {_STALE_ATTEMPTS} times in a row")


def _run_once(spark: Any, batch: Batch, spec: DecodeSpec, path: str) -> BatchResult:
    config = batch.table
    stages = _Stages()
    started = time.perf_counter()
    main = DeltaTarget(
        TableLocation.of(config.uri, config.storage_options), partition_by=config.partition_by
    )
    dead_target = DeltaTarget(TableLocation.of(config.dead_letters, config.dead_letter_options))
    apps = {key: app_id(config.uri, config.group, *key) for key in batch.partitions()}

    def app_id_of(topic: str, partition: int) -> str:
        return apps.get((topic, partition)) or app_id(config.uri, config.group, topic, partition)

    last = batch.last_offsets()
    table = main.load()
    main.check_partitioning(table)
    if batch.overwrite:
        if config.mode == "upsert":
            raise ConfigError(
                "applies to append mode; an upsert replay MERGEs, which already replaces",
                key="--overwrite",
            )
        # Everything in range is written again; the commits take the old rows out.
        planned: dict[str, int | None] = dict.fromkeys(apps.values())
        dead_planned: dict[str, int | None] = dict.fromkeys(apps.values())
    else:
        planned = DeltaTarget.versions_in(table, list(apps.values()))
        dead_planned = dead_target.versions(list(apps.values()))
    ingest_time = dt.datetime.now(dt.UTC)
    token = uuid.uuid4().hex[:16]
    wanted = [
        s
        for s in batch.segments
        if s.record_count and s.last_offset > _or_minus_one(planned[apps[(s.topic, s.partition)]])
    ]
    tasks = group_segments(
        wanted,
        skip_through={key: planned[app] for key, app in apps.items()},
        dead_skip_through={key: dead_planned[app] for key, app in apps.items()},
        parallelism=_parallelism(spark) if wanted else 1,
    )
    upserting = config.mode == "upsert"
    plan = ReadPlan(
        mode="files",
        token=token,
        tasks=tasks,
        spec=spec,
        table=main.location,
        dead=dead_target.location,
        partition_by=() if upserting else config.partition_by,
        prefix=f"{STAGING}/{token}" if upserting else "",
        segment_options=dict(batch.segment_storage_options),
        ingest_time=ingest_time,
    )
    started = stages.lap("plan", started)

    data_files: list[DataFile] = []
    dead_files: list[DataFile] = []
    transform_dead: list[tuple[str, int, int, str]] = []
    schema = spec.output_schema()
    # Until a commit takes them over (and cleans up after itself), files written
    # for this attempt are deleted if it fails.
    handed_over = {"dead": False, "main": False}
    try:
        if tasks:
            if path == "arrow":
                rows = _run_files_tasks(spark, plan)
            else:
                _register(spark)  # ~1 s the first time; the arrow path needs no data source
                rows, schema = _transform(spark, batch, plan, spec)
            for kind, text in rows:
                if kind == KIND_DATA:
                    data_files.append(DataFile.from_json(text))
                elif kind == KIND_DEAD:
                    dead_files.append(DataFile.from_json(text))
                else:
                    topic, partition, offset, message = json.loads(text)
                    transform_dead.append((topic, int(partition), int(offset), message))
            if path == "spark":
                names = [f"{dead_letter_name(token, i)}-0.parquet" for i in range(len(tasks))]
                dead_files.extend(read_data_file_footer(dead_target.location, names))
        elif config.transform:
            schema = _transform_schema(spark, spec, config)
        started = stages.lap("spark", started)

        # Driver-side dead letters: corrupt batches, transform rejects, null merge keys.
        extra: list[pa.Table] = []
        corrupt = [
            c
            for c in batch.corrupt
            if c.first_offset > _or_minus_one(planned[apps[(c.topic, c.partition)]])
            and c.first_offset > _or_minus_one(dead_planned[apps[(c.topic, c.partition)]])
        ]
        if corrupt:
            extra.append(
                corrupt_dead_letters(
                    [(c, _read_raw(c.uri, batch.segment_storage_options)) for c in corrupt],
                    ingest_time=ingest_time,
                )
            )
        if transform_dead:
            extra.append(
                _segment_dead_letters(
                    batch, transform_dead, STAGE_TRANSFORM, dead_planned, apps, ingest_time
                )
            )
        source = None
        if upserting:
            source, keyless = _upsert_source(main.location, data_files, schema, config.merge_keys)
            if keyless is not None:
                message = f"a merge key is null ({', '.join(config.merge_keys)})"
                rejected = [
                    (t, p, o, message)
                    for t, p, o in zip(
                        keyless.column("topic").to_pylist(),
                        keyless.column("partition").to_pylist(),
                        keyless.column("offset").to_pylist(),
                        strict=True,
                    )
                ]
                stage = STAGE_TRANSFORM if config.transform else STAGE_DECODE
                extra.append(
                    _segment_dead_letters(batch, rejected, stage, dead_planned, apps, ingest_time)
                )
        extra_rows = [t for t in extra if t.num_rows]
        if extra_rows:
            dead_files.extend(
                write_data_files(
                    pa.concat_tables(extra_rows),
                    dead_target.location,
                    name=f"part-{token}-driver-dead",
                )
            )
        dead_outcome = None
        handed_over["dead"] = True
        if batch.overwrite:
            if dead_files or dead_target.load() is not None:
                dead_outcome = dead_target.commit_replacing(
                    dead_files,
                    {apps[key]: last[key] for key in apps},
                    DEAD_LETTER_SCHEMA,
                    ranges=batch.offset_ranges(),
                )
        elif dead_files:
            dead_outcome = dead_target.commit_files(
                dead_files,
                {apps[key]: last[key] for key in apps},
                DEAD_LETTER_SCHEMA,
                planned=dead_planned,
                app_id_of=app_id_of,
            )
        started = stages.lap("dead_letters", started)

        txns = {apps[key]: last[key] for key in apps}
        fault_point("before_delta_commit")
        handed_over["main"] = True
        if upserting:
            assert source is not None
            outcome = upsert(
                main, source, merge_keys=config.merge_keys, txns=txns, app_id_of=app_id_of
            )
        elif batch.overwrite:
            outcome = main.commit_replacing(data_files, txns, schema, ranges=batch.offset_ranges())
        else:
            outcome = main.commit_files(
                data_files, txns, schema, planned=planned, app_id_of=app_id_of
            )
        stages.lap("commit", started)
    except BaseException:
        if not handed_over["dead"]:
            dead_target.location.delete(f.path for f in dead_files)
        if not handed_over["main"] and not upserting:
            main.location.delete(f.path for f in data_files)
        raise
    finally:
        if upserting:
            main.location.delete_dir(f"{STAGING}/{token}")
    result = _result(outcome, dead_outcome, apps, path if tasks else "none", stages)
    if batch.overwrite:
        result = BatchResult(**{**result.__dict__, "replaced_rows": outcome.dropped_rows})
    return result


def _parallelism(spark: Any) -> int:
    try:
        return max(int(spark.sparkContext.defaultParallelism), 1)
    except Exception:  # a Spark Connect session has no sparkContext
        return 2


def group_segments(
    segments: Sequence[SegmentSealed],
    *,
    skip_through: Mapping[PartitionKey, int | None],
    dead_skip_through: Mapping[PartitionKey, int | None],
    parallelism: int,
) -> tuple[SegmentTask, ...]:
    """Spark tasks for a batch: each partition's records cut into pieces of equal size,
    a piece spanning consecutive segments (or a row range of a local one).

    A task (and a Parquet file) per segment made small batches pay Spark's per-task
    cost hundreds of times (measured: 50k rows in 160 segments 8.2-10.7 s, in 4
    segments 0.5-1.3 s, warm session); one task per segment left cores idle when the
    count did not divide by them (3 segments on 2 cores: the last one alone). The
    piece size is the one, for 1 to 4 waves of tasks per core, whose tasks finish
    soonest when scheduled on ``parallelism`` cores, counting a fixed cost per task."""
    cores = max(parallelism, 1)
    by_partition: dict[PartitionKey, list[SegmentSealed]] = {}
    for segment in sorted(segments, key=lambda s: (s.topic, s.partition, s.first_offset)):
        by_partition.setdefault((segment.topic, segment.partition), []).append(segment)
    sizes = {key: sum(s.bytes for s in run) for key, run in by_partition.items()}
    total = sum(sizes.values())
    if not total:
        return ()
    best: tuple[float, int, dict[PartitionKey, int]] | None = None
    for waves in range(1, 5):
        piece = min(max(total / (cores * waves), _MIN_TASK_BYTES), _MAX_TASK_BYTES)
        counts = {key: _piece_count(size, piece) for key, size in sizes.items()}
        loads = sorted(
            (
                sizes[key] / count + _TASK_COST_BYTES
                for key, count in counts.items()
                for _ in range(count)
            ),
            reverse=True,
        )
        finish = [0.0] * cores
        for load in loads:  # longest first, each on the core free soonest
            finish[finish.index(min(finish))] += load
        candidate = (max(finish), len(loads), counts)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    assert best is not None
    tasks: list[SegmentTask] = []
    for key, run in by_partition.items():
        for uris, rows in _pieces(run, best[2][key]):
            tasks.append(
                SegmentTask(uris, key[0], key[1], skip_through[key], dead_skip_through[key], rows)
            )
    return tuple(tasks)


def _local(run: Sequence[SegmentSealed]) -> bool:
    """Segments a task can map instead of download (a row range of one is then cheap)."""
    return all("://" not in s.uri for s in run)


def _piece_count(size: int, piece: float) -> int:
    return max(1, round(size / piece), -(-size // _MAX_TASK_BYTES))


def _pieces(
    run: Sequence[SegmentSealed], count: int
) -> list[tuple[tuple[str, ...], tuple[int, int] | None]]:
    """``run`` (one partition's consecutive segments) cut into ``count`` pieces: the
    segments each covers, and the row range within them (None: all of their rows).
    Remote segments are not cut: consecutive ones are grouped up to a piece's size."""
    if count <= 1:
        return [(tuple(s.uri for s in run), None)]
    if not _local(run):
        piece = sum(s.bytes for s in run) / count
        groups: list[list[SegmentSealed]] = [[]]
        group_bytes = 0
        for segment in run:
            if groups[-1] and group_bytes + segment.bytes > piece:
                groups.append([])
                group_bytes = 0
            groups[-1].append(segment)
            group_bytes += segment.bytes
        return [(tuple(s.uri for s in group), None) for group in groups]
    # starts[i]: the first row of segment i within the run; starts[-1]: all rows.
    starts = list(itertools.accumulate((s.record_count for s in run), initial=0))
    bounds = [starts[-1] * i // count for i in range(count + 1)]
    pieces: list[tuple[tuple[str, ...], tuple[int, int] | None]] = []
    for low, high in itertools.pairwise(bounds):
        if low == high:
            continue
        first = bisect.bisect_right(starts, low) - 1  # the segment holding row ``low``
        last = bisect.bisect_left(starts, high) - 1  # the last one starting below ``high``
        window = (low - starts[first], high - starts[first])
        whole = (0, starts[last + 1] - starts[first])
        uris = tuple(s.uri for s in run[first : last + 1])
        pieces.append((uris, None if window == whole else window))
    return pieces


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version


def _result(
    outcome: CommitOutcome,
    dead_outcome: CommitOutcome | None,
    apps: Mapping[PartitionKey, str],
    path: str,
    stages: _Stages,
) -> BatchResult:
    return BatchResult(
        table_version=outcome.version,
        dead_letter_version=None if dead_outcome is None else dead_outcome.version,
        durable_offsets={key: outcome.txn_versions.get(app) for key, app in apps.items()},
        rows_written=outcome.rows,
        dead_letters=0 if dead_outcome is None else dead_outcome.rows,
        stage_seconds=stages.done(),
        path=path,
        files=len(outcome.files),
    )


def _read_raw(uri: str, options: Mapping[str, Any]) -> bytes:
    if "://" not in uri or uri.startswith("file://"):
        with open(uri.removeprefix("file://"), "rb") as raw:
            return raw.read()
    import pyarrow.fs as pafs

    scheme, _, rest = uri.partition("://")
    filesystem = (
        pafs.S3FileSystem(**options) if scheme == "s3" else pafs.FileSystem.from_uri(uri)[0]
    )
    with filesystem.open_input_stream(rest if scheme == "s3" else uri) as stream:
        return bytes(stream.read())


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
        spark.read.format(SegmentSource.name())
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


def _sql(spark: Any, config: TableConfig) -> Any:
    try:
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
    missing = sorted({c for c in needed if c not in columns})
    if missing:
        raise ConfigError(
            f"the transform's output must keep the columns {missing}", key="table.transform"
        )
    return out


def _transform(
    spark: Any, batch: Batch, plan: ReadPlan, spec: DecodeSpec
) -> tuple[list[Any], pa.Schema]:
    config = batch.table
    _batch_view(spark, plan, spec)
    out = _sql(spark, config)
    schema = _arrow_schema(out.drop(DEAD_LETTER_COLUMN).schema)
    writer = _ArrowWriter(plan.table, plan.token, plan.partition_by, plan.prefix)
    rows = out.mapInArrow(writer, FILES_SCHEMA).collect()
    return rows, schema


class _ArrowWriter:
    """The mapInArrow function that writes a transform's output as data files."""

    def __init__(
        self, location: TableLocation, token: str, partition_by: Sequence[str], prefix: str
    ) -> None:
        self.location = location
        self.token = token
        self.partition_by = tuple(partition_by)
        self.prefix = prefix

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
        )
        for data_file in files:
            kinds.append(KIND_DATA)
            texts.append(data_file.to_json())
        if kinds:
            yield pa.RecordBatch.from_arrays(
                [pa.array(kinds, pa.string()), pa.array(texts, pa.string())], names=["kind", "file"]
            )


def _segment_dead_letters(
    batch: Batch,
    rejected: Sequence[tuple[str, int, int, str]],
    stage: str,
    dead_planned: Mapping[str, int | None],
    apps: Mapping[PartitionKey, str],
    ingest_time: dt.datetime,
) -> pa.Table:
    """Dead letters of rows refused after decoding (by the transform, or for a null
    merge key), with their raw records read back from the segments: the rows
    themselves may no longer hold the raw value, key and headers."""
    wanted: dict[PartitionKey, dict[int, str]] = {}
    for topic, partition, offset, message in rejected:
        if offset > _or_minus_one(dead_planned.get(apps[(topic, partition)])):
            wanted.setdefault((topic, partition), {})[offset] = message
    pieces: list[pa.Table] = []
    for segment in batch.segments:
        offsets = wanted.get((segment.topic, segment.partition))
        if not offsets or not any(
            segment.first_offset <= o <= segment.last_offset for o in offsets
        ):
            continue
        records = spark_records(
            read_segment(segment.uri, storage_options=batch.segment_storage_options)
        )
        chosen = records.filter(
            pc.is_in(records.column("offset"), pa.array(list(offsets), pa.int64()))
        )
        messages = [offsets[o] for o in chosen.column("offset").to_pylist()]
        pieces.append(dead_letters(chosen, stage, messages, ingest_time=ingest_time))
    if not pieces:
        return DEAD_LETTER_SCHEMA.empty_table()
    return pa.concat_tables(pieces)


# -- upsert --------------------------------------------------------------------------------


def _upsert_source(
    location: TableLocation,
    files: Sequence[DataFile],
    schema: pa.Schema,
    merge_keys: Sequence[str],
) -> tuple[pa.Table, pa.Table | None]:
    """The staged rows to merge, and those without a merge key."""
    if files:
        filesystem, root = location.filesystem()
        dataset = pads.dataset(
            [f"{root}/{f.path}" for f in files], format="parquet", filesystem=filesystem
        )
        rows = dataset.to_table().cast(schema)
    else:
        rows = schema.empty_table()
    missing = [k for k in merge_keys if k not in rows.column_names]
    if missing:
        raise ConfigError(
            f"merge keys {missing} are not columns of the batch", key="table.merge_keys"
        )
    keyless = null_key_rows(rows, merge_keys)
    if not keyless.any():
        return rows, None
    mask = pa.array(keyless)
    return rows.filter(pc.invert(mask)), rows.filter(mask)
