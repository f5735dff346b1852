"""The landing protocol without Spark: ``ingest.sink.land`` run with a writer that does
the Spark tasks' work in this process (``source.read_task``, pure pyarrow)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from ingest.engines.drive import drive_landing
from ingest.engines.plan import encode_plan
from ingest.engines.spark.python_worker.segment_source import ReadPlan, read_task
from ingest.engines.tasks import group_segments
from ingest.formats.decode import DecodeSpec, spark_records
from ingest.handoff import HandoffConfig, HandoffStore, SegmentSealed, SegmentWriter
from ingest.protocol.recordbatch.records import RECORD_SCHEMA
from ingest.sink.batch import Batch, BatchResult, WriteRequest, WrittenFiles
from ingest.sink.deadletter import STAGE_TRANSFORM, Rejected, dead_letters
from ingest.sink.delta import DeltaTarget
from ingest.sink.files import DataFile, write_data_files
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import TableConfig
from ingest.sink.txn import app_id

TOPIC = "t"
BAD = b"\xff\xfe"  # not UTF-8: a decode dead letter in "string" format


def land(batch: Batch, files: LocalFiles) -> BatchResult:
    """The landing of ``batch``, driven as an engine drives it, with ``files`` writing."""
    return drive_landing(batch, files.write)


class LocalFiles:
    """The landing's writes, running the plan's tasks here, one after the other (as
    ``source.files_task`` does); rows at the offsets in ``reject`` are reported as rows a
    transform marked in ``_dead_letter``, not written."""

    def __init__(self, reject: tuple[int, ...] = ()) -> None:
        self.reject = reject

    def write(self, request: WriteRequest) -> WrittenFiles:
        return self.plan(request)()

    def plan(self, request: WriteRequest) -> Callable[[], WrittenFiles]:
        plan = ReadPlan(
            mode="files",
            token=request.token,
            tasks=group_segments(
                request.segments,
                skip_through=request.skip_through,
                dead_skip_through=request.dead_skip_through,
                parallelism=1,
            ),
            spec=DecodeSpec("string"),
            table=request.table,
            dead=request.dead,
            partition_by=request.partition_by,
            prefix=request.prefix,
            segment_options=request.segment_options,
            ingest_time=request.ingest_time,
        )

        def run() -> WrittenFiles:
            data: list[DataFile] = []
            dead: list[DataFile] = []
            rejected: list[Rejected] = []
            for index in range(len(plan.tasks)):
                rows, bad = read_task(plan, index)
                marked = pc.is_in(rows.column("offset"), pa.array(self.reject, pa.int64()))
                rejected += [
                    (TOPIC, 0, offset, f"rejected {offset}")
                    for offset in rows.filter(marked).column("offset").to_pylist()
                ]
                name = f"part-{plan.token}-{index:05d}"
                data += write_data_files(
                    rows.filter(pc.invert(marked)),
                    plan.table,
                    name=name,
                    partition_by=plan.partition_by,
                    prefix=plan.prefix,
                )
                dead += write_data_files(bad, plan.dead, name=f"{name}-dead")
            return WrittenFiles(
                tuple(data),
                tuple(dead),
                tuple(rejected),
                DecodeSpec("string").output_schema(),
                "arrow" if plan.tasks else "none",
            )

        return run


def values(start: int, count: int) -> list[bytes]:
    """Every 7th value is not UTF-8."""
    return [BAD if o % 7 == 0 else b"v%d" % o for o in range(start, start + count)]


def segment(store: HandoffStore, start: int, count: int) -> SegmentSealed:
    batch = pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)), pa.array([TOPIC])),
            pa.array(np.zeros(count, np.int32)),
            pa.array(np.arange(start, start + count, dtype=np.int64)),
            pa.array(1_700_000_000_000 + np.arange(count), pa.timestamp("ms", tz="UTC")),
            pa.array(np.zeros(count, np.int8)),
            pa.array([b"k%d" % o for o in range(start, start + count)], pa.binary()),
            pa.array(values(start, count), pa.binary()),
            pa.array([[("h", b"x")]] * count, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )
    writer = SegmentWriter(store.location, TOPIC, 0, start_offset=start)
    writer.append(batch)
    sealed = writer.seal(start + count)
    assert sealed is not None
    return sealed


@pytest.fixture
def store() -> Iterator[HandoffStore]:
    with HandoffStore(HandoffConfig()) as opened:
        yield opened


def rows_of(uri: str) -> pa.Table:
    return DeltaTable(uri).to_pyarrow_table().sort_by("offset")


def parquet_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*.parquet") if "_delta_log" not in p.parts)


def test_dead_letters_and_rows_land_once_and_a_replay_lands_nothing_twice(
    tmp_path: Path, store: HandoffStore
) -> None:
    config = TableConfig(uri=str(tmp_path / "events"), group="g", value_format="string")
    segments = (segment(store, 0, 40), segment(store, 40, 40))
    result = land(Batch(config, segments), LocalFiles(reject=(3, 45)))
    good = [o for o in range(80) if o % 7 and o not in (3, 45)]
    undecodable = [o for o in range(80) if o % 7 == 0]
    assert (result.rows_written, result.dead_letters) == (len(good), len(undecodable) + 2)
    assert result.durable_offsets == {(TOPIC, 0): 79}
    assert result.path == "arrow" and result.attempts == 1 and result.files == 1
    assert set(result.stage_seconds) == {"plan", "spark", "dead_letters", "commit", "total"}
    assert rows_of(config.uri).column("offset").to_pylist() == good
    app = app_id(config.uri, "g", TOPIC, 0)
    assert DeltaTable(config.dead_letters).transaction_version(app) == 79
    assert DeltaTable(config.uri).transaction_version(app) == 79
    # The transform's rejects carry their raw records, read back from the segments,
    # exactly as the records' own dead letters would be.
    dead = rows_of(config.dead_letters)
    assert dead.column("offset").to_pylist() == sorted([*undecodable, 3, 45])
    marked = dead.filter(pc.equal(dead.column("error_stage"), STAGE_TRANSFORM))
    raw = pa.concat_tables(spark_records(store.read(s.uri, memory_map=False)) for s in segments)
    raw = raw.filter(pc.is_in(raw.column("offset"), pa.array([3, 45], pa.int64())))
    moment = marked.column("ingest_time")[0].as_py()
    expected = dead_letters(raw, STAGE_TRANSFORM, ["rejected 3", "rejected 45"], ingest_time=moment)
    assert marked.to_pylist() == expected.to_pylist()
    # A replay is filtered by both tables' txn versions: nothing lands twice.
    again = land(Batch(config, segments), LocalFiles(reject=(3, 45)))
    assert (again.rows_written, again.dead_letters, again.path) == (0, 0, "none")
    assert rows_of(config.dead_letters).num_rows == dead.num_rows


def test_a_crash_before_the_table_commit_is_completed_by_a_replay(
    tmp_path: Path, store: HandoffStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead letters are committed first: a crash before the table's commit leaves them
    in, and the replay lands the rows without landing a dead letter twice."""
    config = TableConfig(uri=str(tmp_path / "events"), group="g", value_format="string")
    segments = (segment(store, 0, 40),)
    commit = DeltaTarget.commit_files

    def crash_on_the_table(self: DeltaTarget, *args: Any, **kwargs: Any) -> Any:
        if self.uri == config.uri:
            raise RuntimeError("the driver died here")
        return commit(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(DeltaTarget, "commit_files", crash_on_the_table)
        with pytest.raises(RuntimeError, match="died"):
            land(Batch(config, segments), LocalFiles())
    undecodable = [o for o in range(40) if o % 7 == 0]
    assert rows_of(config.dead_letters).column("offset").to_pylist() == undecodable
    assert DeltaTarget(TableLocation.of(config.uri)).load() is None
    result = land(Batch(config, segments), LocalFiles())
    assert result.dead_letters == 0 and result.rows_written == 40 - len(undecodable)
    assert rows_of(config.dead_letters).column("offset").to_pylist() == undecodable


def test_files_of_an_attempt_that_fails_before_its_commits_are_deleted(
    tmp_path: Path, store: HandoffStore
) -> None:
    config = TableConfig(uri=str(tmp_path / "events"), group="g", value_format="string")
    segments = (segment(store, 0, 40),)
    writer = SegmentWriter(store.location, TOPIC, 0, start_offset=40)
    corrupt = writer.write_corrupt(
        first_offset=40, last_offset=41, raw=b"garbage", reason="CRC mismatch", kind="crc"
    )
    Path(corrupt.uri).unlink()  # its raw bytes cannot be read: the driver fails
    with pytest.raises(FileNotFoundError):
        land(Batch(config, segments, corrupt=(corrupt,)), LocalFiles())
    assert parquet_files(tmp_path) == []
    assert not list(tmp_path.rglob("_delta_log"))


def test_an_overwrite_replaces_the_range_in_both_tables(
    tmp_path: Path, store: HandoffStore
) -> None:
    config = TableConfig(uri=str(tmp_path / "events"), group="g", value_format="string")
    segments = (segment(store, 0, 40), segment(store, 40, 40))
    land(Batch(config, segments), LocalFiles(reject=(3,)))
    before, before_dead = rows_of(config.uri), rows_of(config.dead_letters)
    in_range = [o for o in before.column("offset").to_pylist() if o >= 40]
    replay = land(Batch(config, segments[1:], overwrite=True), LocalFiles(reject=(45,)))
    assert replay.replaced_rows == len(in_range) and replay.rows_written == len(in_range) - 1
    assert replay.durable_offsets == {(TOPIC, 0): 79}
    offsets = [o for o in before.column("offset").to_pylist() if o != 45]
    assert rows_of(config.uri).column("offset").to_pylist() == offsets
    dead_offsets = sorted([*before_dead.column("offset").to_pylist(), 45])
    assert rows_of(config.dead_letters).column("offset").to_pylist() == dead_offsets


def test_a_local_engine_task_does_not_import_pandas(store: HandoffStore, tmp_path: Path) -> None:
    # pyarrow imports pandas (0.25-0.7 s) for pa.array() of a list, Schema.empty_table()
    # and a compute function's bytes argument; a task process's first task paid it.
    count = 50
    batch = pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)), pa.array([TOPIC])),
            pa.array(np.zeros(count, np.int32)),
            pa.array(np.arange(count, dtype=np.int64)),
            pa.array(1_700_000_000_000 + np.arange(count), pa.timestamp("ms", tz="UTC")),
            pa.array(np.zeros(count, np.int8)),
            pa.array([None] * count, pa.binary()),
            pa.array([b'{"id": %d, "name": "n%d"}' % (o, o) for o in range(count)], pa.binary()),
            pa.array([[]] * count, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )
    writer = SegmentWriter(store.location, TOPIC, 0, start_offset=0)
    writer.append(batch)
    sealed = writer.seal(count)
    assert sealed is not None
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    plan = ReadPlan(
        mode="files",
        token="no-pandas",
        tasks=group_segments(
            [sealed],
            skip_through={(TOPIC, 0): None},
            dead_skip_through={(TOPIC, 0): None},
            parallelism=1,
        ),
        spec=DecodeSpec("json", schema),
        table=TableLocation.of(str(tmp_path / "table")),
        dead=TableLocation.of(str(tmp_path / "dead")),
    )
    code = (
        "import sys\n"
        "from ingest.engines.local.task_process import run_task\n"
        f"rows = run_task({encode_plan(plan)!r}, 0)\n"
        "assert [kind for kind, _ in rows] == ['data'], rows\n"
        "assert 'pandas' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
