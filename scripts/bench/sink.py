"""Benchmark of the sink: 1M records of 100-byte values from handoff segments into Delta.

Compares, on the same records (4 segments of 250k in /dev/shm, warm local[2]
session):

* the job, no transform (arrow path: Spark tasks write Parquet with pyarrow,
  one delta-rs commit);
* the job forced through the JVM (the records view, ``SELECT * FROM batch``,
  mapInArrow writer), the path a transform takes;
* a transform's output written by Spark's own Parquet writer instead (to check
  the writer choice);
* ``deltalake.write_deltalake`` of the same Arrow table (decoded records);
* ``spark.createDataFrame(arrow).write.parquet``.

Each is timed ``--repeat`` times on a fresh table; the best run counts. The last
line is ``RESULT spark_job_vs_deltars_time=<job / write_deltalake>``.

    .venv/bin/python scripts/bench/sink.py [--records 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from ingest.engines.spark.job import Batch, _batch_view, _register, run_batch
from ingest.engines.spark.python_worker.segment_source import ReadPlan, SegmentTask
from ingest.formats.decode import DecodeSpec, spark_records
from ingest.handoff import HandoffConfig, HandoffStore, SegmentSealed, SegmentWriter
from ingest.protocol.recordbatch.records import RECORD_SCHEMA
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import TableConfig
from ingest.testing.spark import local_spark_session

SEGMENTS = 4
VALUE_BYTES = 100


def make_records(topic: str, partition: int, start: int, count: int) -> pa.RecordBatch:
    rng = np.random.default_rng(partition)
    values = rng.integers(32, 127, size=count * VALUE_BYTES, dtype=np.uint8)
    offsets = np.arange(0, (count + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
    keys = [b"key-%d" % (i % 10_000) for i in range(start, start + count)]
    headers_type = RECORD_SCHEMA.field("headers").type
    return pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)), pa.array([topic])),
            pa.array(np.full(count, partition, np.int32)),
            pa.array(np.arange(start, start + count, dtype=np.int64)),
            pa.array(
                1_700_000_000_000 + np.arange(count, dtype=np.int64), pa.timestamp("ms", tz="UTC")
            ),
            pa.array(np.zeros(count, np.int8)),
            pa.array(keys, pa.binary()),
            pa.BinaryArray.from_buffers(
                pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
            ),
            pa.array([[]] * count, headers_type),
        ],
        schema=RECORD_SCHEMA,
    )


def write_segments(store: HandoffStore, total: int) -> list[SegmentSealed]:
    sealed = []
    per = total // SEGMENTS
    for partition in range(SEGMENTS):
        writer = SegmentWriter(store.location, "bench", partition)
        for start in range(0, per, 50_000):
            writer.append(make_records("bench", partition, start, min(50_000, per - start)))
        segment = writer.seal(per)
        assert segment is not None
        sealed.append(segment)
    return sealed


def best_of(repeat: int, run: Callable[[str], object], workdir: str, label: str) -> float:
    times = []
    for attempt in range(repeat):
        target = f"{workdir}/{label}-{attempt}"
        started = time.perf_counter()
        run(target)
        times.append(time.perf_counter() - started)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(f"{target}_dead_letters", ignore_errors=True)
    best = min(times)
    print(f"{label:<44} best {best:6.2f} s  runs {' '.join(f'{t:.2f}' for t in times)}")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from deltalake import write_deltalake

    spark = local_spark_session(app_name="ingest-bench-sink")
    workdir = tempfile.mkdtemp(prefix="ingest-bench-sink-")
    try:
        with HandoffStore(HandoffConfig(segment_max_bytes=1 << 30)) as store:
            segments = tuple(write_segments(store, args.records))
            arrow = pa.concat_tables(spark_records(store.read(s.uri)) for s in segments)
            size = sum(s.bytes for s in segments)
            print(
                f"{args.records} records, {len(segments)} segments, {size / 2**20:.0f} MiB of Arrow"
            )

            def job(path: str, transform: str | None = None) -> Callable[[str], object]:
                def run(target: str) -> object:
                    config = TableConfig(uri=target, group="bench", transform=transform)
                    result = run_batch(spark, Batch(config, segments), path=path)
                    assert result.rows_written == args.records, result
                    return result

                return run

            # Warm-up: Python workers and the data source registration.
            job("arrow")(f"{workdir}/warm")
            job("spark")(f"{workdir}/warm-spark")

            rows_per_second = {}
            job_time = best_of(args.repeat, job("arrow"), workdir, "job, no transform (arrow path)")
            rows_per_second["job"] = args.records / job_time
            jvm_time = best_of(args.repeat, job("spark"), workdir, "job, rows through the JVM")
            rows_per_second["job via JVM"] = args.records / jvm_time

            def spark_writer(target: str) -> None:
                _register(spark)
                location = TableLocation.of(target)
                plan = ReadPlan(
                    mode="records",
                    token="bench",
                    tasks=tuple(
                        SegmentTask((s.uri,), s.topic, s.partition, None, None) for s in segments
                    ),
                    spec=DecodeSpec(),
                    table=location,
                    dead=TableLocation.of(f"{target}_dead_letters"),
                )
                _batch_view(spark, plan, DecodeSpec())
                spark.sql("SELECT * FROM batch").write.mode("append").parquet(target)

            best_of(
                args.repeat, spark_writer, workdir, "transform output by Spark's Parquet writer"
            )

            def direct(target: str) -> None:
                write_deltalake(target, arrow, mode="append")

            delta_time = best_of(args.repeat, direct, workdir, "deltalake.write_deltalake")
            rows_per_second["write_deltalake"] = args.records / delta_time

            def spark_parquet(target: str) -> None:
                spark.createDataFrame(arrow).write.mode("append").parquet(target)

            parquet_time = best_of(
                args.repeat, spark_parquet, workdir, "spark.createDataFrame().write.parquet"
            )
            rows_per_second["createDataFrame+parquet"] = args.records / parquet_time
            for name, rate in rows_per_second.items():
                print(f"{name:<44} {rate / 1e6:6.2f} M rows/s")
            print(f"RESULT spark_job_vs_deltars_time={job_time / delta_time:.2f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
