"""The physical floor of an end-to-end run: the work no pipeline can avoid, each part
measured alone, in the same run as the pipelines (e2e.py).

* **(f1) the broker serving the topic's bytes.** Apache Kafka's own consumer performance
  tool (``org.apache.kafka.tools.ConsumerPerformance``, ``kafka-tools`` from Maven Central,
  the broker's release) reads every record of the topic with its own group and does nothing
  with them. Counted: the broker JVM's CPU seconds meanwhile (from /proc), less what it
  spends idle in as long (its rate over the 3 s before: KRaft's heartbeats and timers,
  which it spends whoever reads). Shown beside it: the tool's wall time and its own CPU (a
  JVM's start and JIT, not the broker's work).
* **(f2) parsing.** The values, already in memory as one newline-joined buffer, parsed into
  the table's value columns by pyarrow's JSON reader (the parser ingest's JSON decode
  calls, with its block size and explicit schema), one process per core, each a share of
  the values, on one thread each. Counted: the processes' CPU seconds around the parse.
* **(f3) writing.** Those columns, with the Kafka columns of the table (topic, partition,
  offset, timestamp, ...), written as Parquet files with ingest's layout
  (``ingest.sink.files.parquet_options``, its row-group size), one file per process.
  Counted: the CPU seconds around the write.

``floor = (f1 + f2 + f3 CPU seconds) / cores``: the wall time of a pipeline that did nothing
but this work, spread perfectly over the machine. ``vs_floor = floor / ours`` (1 is the
floor; ingest's own process start, group join, handoff, statistics and commit are the
rest).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from _pipeline import OUTPUT_SCHEMA, VALUE_SCHEMA, json_value

from ingest.jars import resolve
from ingest.sink.files import ROW_GROUP_ROWS, parquet_options
from ingest.testing import unique_name
from ingest.testing.kafka_node import KAFKA_VERSION

_CLK_TCK = os.sysconf("SC_CLK_TCK")
KAFKA_TOOLS = (f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",)
# ingest's JSON decode reads with this block size (ingest/formats/text_values.py).
JSON_BLOCK = 16 << 20


@dataclass(frozen=True)
class Floor:
    broker_cpu: float  # f1: the broker JVM's CPU seconds while the tool read the topic, less idle
    tool_seconds: float  # f1: the tool's wall time (shown, not counted)
    tool_cpu: float  # f1: the tool's own CPU seconds (shown, not counted)
    broker_idle: float  # f1: the broker's idle CPU seconds per second, taken off broker_cpu
    parse_cpu: float  # f2
    write_cpu: float  # f3
    cores: int

    @property
    def cpu(self) -> float:
        return self.broker_cpu + self.parse_cpu + self.write_cpu

    @property
    def seconds(self) -> float:
        return self.cpu / self.cores

    def describe(self) -> str:
        return (
            f"f1 broker {self.broker_cpu:.2f} CPU s (idle {self.broker_idle:.3f} CPU s/s taken"
            f" off; tool {self.tool_seconds:.1f} s wall, {self.tool_cpu:.1f} CPU s of its own), f2 parse {self.parse_cpu:.2f} CPU s,"
            f" f3 write {self.write_cpu:.2f} CPU s; floor {self.cpu:.2f} / {self.cores}"
            f" cores = {self.seconds:.2f} s"
        )


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (its own threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def children_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s waited-for children (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / _CLK_TCK


# -- f1: the broker serving the bytes ---------------------------------------------------------


IDLE_SAMPLE_S = 3.0


def broker_read(
    bootstrap: str, broker_pid: int, topic: str, records: int, log: Path
) -> tuple[float, float, float, float]:
    """(broker CPU seconds less idle, idle CPU seconds per second, tool wall seconds, tool
    CPU seconds) of one full read of ``topic`` by Kafka's ConsumerPerformance, with fetch
    sizes as large as ingest's."""
    classpath = ":".join(str(jar) for jar in resolve(KAFKA_TOOLS))
    argv = [
        "java",
        "-Xmx1g",
        "-cp",
        classpath,
        "org.apache.kafka.tools.ConsumerPerformance",
        *("--bootstrap-server", bootstrap, "--topic", topic),
        *("--num-records", str(records), "--group", unique_name("floor")),
        # ingest's defaults: [source] max_bytes 50 MiB, partition_max_bytes 8 MiB.
        *("--fetch-size", str(8 << 20)),
        *("--command-property", f"fetch.max.bytes={50 << 20}"),
        *("--timeout", "60000"),
    ]
    idle_before = process_cpu(broker_pid)
    time.sleep(IDLE_SAMPLE_S)
    broker_before = process_cpu(broker_pid)
    idle = (broker_before - idle_before) / IDLE_SAMPLE_S
    own_before = children_cpu(os.getpid())
    with open(log, "w") as out:
        began = time.perf_counter()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=600)
        seconds = time.perf_counter() - began
    broker = process_cpu(broker_pid) - broker_before
    tool = children_cpu(os.getpid()) - own_before
    if done.returncode != 0:
        raise RuntimeError(f"ConsumerPerformance exited {done.returncode}; log: {log}")
    consumed = _consumed(log.read_text())
    if consumed < records:
        raise RuntimeError(f"ConsumerPerformance read {consumed} of {records}; log: {log}")
    return max(broker - idle * seconds, 0.0), idle, seconds, tool


def _consumed(output: str) -> int:
    """The ``data.consumed.in.nMsg`` column of the tool's result line."""
    lines = [line for line in output.splitlines() if line.strip()]
    for index, line in enumerate(lines[:-1]):
        if "data.consumed.in.nMsg" in line:
            header = [name.strip() for name in line.split(",")]
            values = [value.strip() for value in lines[index + 1].split(",")]
            return int(values[header.index("data.consumed.in.nMsg")])
    raise RuntimeError(f"ConsumerPerformance printed no result: {output[-2000:]}")


# -- f2 and f3: parse and write, one process per core -----------------------------------------


def _values(first: int, count: int, value_bytes: int) -> pa.Buffer:
    """The values of ids ``first .. first + count`` joined by newlines, as ingest's JSON
    decode joins a segment's values before its parse."""
    now_ms = time.time_ns() // 1_000_000
    return pa.py_buffer(
        b"\n".join(json_value(i, now_ms, value_bytes) for i in range(first, first + count))
    )


def _kafka_columns(topic: str, first: int, count: int) -> list[pa.Array]:
    """The table's Kafka columns for ``count`` records (what a decode builds from the
    record batches; not timed)."""
    offsets = np.arange(first, first + count, dtype=np.int64)
    micros = np.full(count, time.time_ns() // 1000, np.int64)
    empty_lists = pa.ListArray.from_arrays(
        pa.array(np.zeros(count + 1, np.int32)),
        pa.array([], OUTPUT_SCHEMA.field("headers").type.value_type),
    )
    return [
        pa.repeat(pa.scalar(topic), count),
        pa.array(np.zeros(count, np.int32)),
        pa.array(offsets),
        pa.array(micros).cast(OUTPUT_SCHEMA.field("timestamp").type),
        pa.array(np.zeros(count, np.int8)),
        pa.nulls(count, pa.binary()),
        empty_lists,
    ]


def _parse_and_write(job: tuple[int, int, int, str]) -> tuple[float, float, int]:
    first, count, value_bytes, directory = job
    body = _values(first, count, value_bytes)
    began = time.process_time()
    values = pajson.read_json(
        pa.BufferReader(body),
        read_options=pajson.ReadOptions(block_size=JSON_BLOCK, use_threads=False),
        parse_options=pajson.ParseOptions(
            explicit_schema=VALUE_SCHEMA, unexpected_field_behavior="ignore"
        ),
    )
    parse = time.process_time() - began
    if values.num_rows != count:
        raise RuntimeError(f"the JSON reader gave {values.num_rows} rows of {count}")
    kafka = _kafka_columns("floor", first, count)
    table = pa.Table.from_arrays([*kafka, *values.combine_chunks().columns], schema=OUTPUT_SCHEMA)
    path = Path(directory) / f"part-{first}.parquet"
    began = time.process_time()
    with pq.ParquetWriter(path, OUTPUT_SCHEMA, **parquet_options(OUTPUT_SCHEMA)) as writer:
        for start in range(0, count, ROW_GROUP_ROWS):
            writer.write_table(table.slice(start, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
    write = time.process_time() - began
    return parse, write, path.stat().st_size


def parse_and_write(
    records: int, value_bytes: int, cores: int, workdir: Path
) -> tuple[float, float]:
    """(f2, f3): CPU seconds summed over ``cores`` processes, each a share of the records."""
    share = -(-records // cores)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="floor-") as directory:
        jobs = [
            (start, min(share, records - start), value_bytes, directory)
            for start in range(0, records, share)
        ]
        with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
            results = pool.map(_parse_and_write, jobs)
    return sum(r[0] for r in results), sum(r[1] for r in results)


def measure(
    bootstrap: str,
    broker_pid: int,
    topic: str,
    records: int,
    value_bytes: int,
    workdir: Path,
) -> Floor:
    cores = os.cpu_count() or 1
    broker, idle, tool_seconds, tool_cpu = broker_read(
        bootstrap, broker_pid, topic, records, workdir / "floor-consumer-perf.log"
    )
    parse, write = parse_and_write(records, value_bytes, cores, workdir)
    return Floor(broker, tool_seconds, tool_cpu, idle, parse, write, cores)
