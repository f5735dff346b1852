"""kafka-delta-ingest as a peer of the end-to-end benchmark, given its binary.

The binary is built outside this repository from the upstream source (docs/benchmarks.md
says how); nothing of it is here. It does not create tables: the target is created first
with delta-rs, with the Kafka partition and offset (its ``kafka.partition`` and
``kafka.offset`` transforms) and the JSON value's fields. It runs with ``-e``, JSON input
without a registry, and batches as large as ingest's (``--max_messages_per_batch``,
``--min_bytes_per_file``) so neither side is judged by a small file size. It writes when
``--allowed_latency`` expires (10 s here, ``e2e.py --kdi-latency``) if no batch filled
before, so a run that reads everything sooner waits it out.

``-e`` alone never ends on a topic nobody writes to (kafka-delta-ingest at c6d42de,
src/lib.rs): at start it reads each partition's high watermark (lines 364-365,
``fetch_latest_offsets`` 578-598, ``get_high_watermark_map`` 1373-1377: the high of
``fetch_watermarks``, the offset *after* the last record) and drops a partition only on
reading a record *at* that offset (line 441, ``end_of_partition_reached`` line 539:
``max_offset == offset``), i.e. the first record produced after it started; it ends once no
partition is left (lines 570-573, 526-527). Its upstream test (tests/offset_tests.rs,
``end_at_initial_offsets``) produces more records to make it end. Nor does it write what it
holds when it ends: it returns at line 527 with its buffers unwritten, so the last records
land only when ``--allowed_latency`` expires (lines 1109-1111, 1131-1133) or a batch fills.

So the harness does what that test does: it watches the table's Delta log and, once the
txn actions (kafka-delta-ingest's offsets, app id ``<app_id>-<partition>``) show every
partition's last offset committed, it produces one record with no value to each partition,
at the offset ``-e`` waits for. kafka-delta-ingest drops the partition (lines 440-443)
before it processes the record, and a record without a value is logged and skipped (lines
847-852: nothing buffered, no dead letter), so the table stays exact and the process exits
0 by itself. The seconds reported are from the start to the commit that completed the
table (the mtime of its Delta log entry), the CPU seconds those spent when the harness saw
that commit (it polls every 50 ms); the process exits later, after this harness saw
the commit and kafka-delta-ingest re-read its remaining partitions: each drop re-assigns
the others with no offset (``unassign_partition``, lines 551-564) and, as it commits no
offsets to Kafka, librdkafka restarts them at ``auto.offset.reset`` (earliest), skipping
what the Delta log already holds (lines 818-820).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from _pipeline import VALUE_SCHEMA, Measured, run_measured

POLL_S = 0.05


def kdi_table_schema() -> pa.Schema:
    return pa.schema([("partition", pa.int32()), ("offset", pa.int64()), *VALUE_SCHEMA])


@dataclass(frozen=True)
class KdiRun:
    measured: Measured  # to the process's exit
    complete_seconds: float | None  # start to the commit that completed the table
    complete_cpu: float | None  # its user + system seconds when this harness saw that commit
    ended_seconds: float | None  # start to the end records' delivery

    def describe(self) -> str:
        def at(value: float | None) -> str:
            return "never" if value is None else f"{value:.1f}s"

        return (
            f"table complete={at(self.complete_seconds)} (CPU {at(self.complete_cpu)})"
            f" end records={at(self.ended_seconds)} exit={self.measured.seconds:.1f}s"
            f" (CPU {self.measured.cpu_seconds:.1f}s)"
        )


class _EndWatcher(threading.Thread):
    """Waits for the Delta log's txn actions to reach ``ends`` (the last offset of each
    partition, ``end - 1``), then produces a record with no value to every partition."""

    def __init__(
        self,
        binary: Path,
        bootstrap: str,
        topic: str,
        app_id: str,
        table: Path,
        ends: Mapping[int, int],
    ) -> None:
        super().__init__(name="kdi-end", daemon=True)
        self.binary = str(binary)
        self.bootstrap, self.topic, self.app_id = bootstrap, topic, app_id
        self.log_dir = table / "_delta_log"
        self.ends = dict(ends)
        self.began = time.time()
        self.stop = threading.Event()
        self.complete_at: float | None = None
        self.complete_cpu: float | None = None
        self.ended_at: float | None = None
        self.error: BaseException | None = None
        self._read: set[Path] = set()
        self._offsets: dict[int, int] = {}

    def _complete_mtime(self) -> float | None:
        """The mtime of the commit that completed the table, once it is there."""
        for entry in sorted(self.log_dir.glob("*.json")):
            if entry in self._read:
                continue
            try:
                lines = entry.read_text().splitlines()
            except FileNotFoundError:
                continue
            if not lines or not lines[-1].endswith("}"):
                continue  # a commit file is written whole, but be safe: read it again
            self._read.add(entry)
            for line in lines:
                txn = json.loads(line).get("txn")
                if txn and txn["appId"].startswith(self.app_id + "-"):
                    partition = int(txn["appId"].rsplit("-", 1)[1])
                    self._offsets[partition] = int(txn["version"])
            if all(self._offsets.get(p) == end - 1 for p, end in self.ends.items()):
                return entry.stat().st_mtime
        return None

    def _cpu_seconds(self) -> float | None:
        """The user + system seconds of the kafka-delta-ingest this process started."""
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                argv0 = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == os.getpid() and argv0.decode() == self.binary:
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                mtime = self._complete_mtime()
                if mtime is not None:
                    self.complete_at = mtime
                    self.complete_cpu = self._cpu_seconds()
                    break
                self.stop.wait(POLL_S)
            else:
                return
            from confluent_kafka import Producer

            producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
            for partition in self.ends:
                producer.produce(self.topic, None, b"end", partition)
            if producer.flush(30):
                raise RuntimeError("the end records were not delivered in 30 s")
            self.ended_at = time.time()
        except BaseException as exc:  # reported by run_kdi
            self.error = exc


def run_kdi(
    binary: Path,
    bootstrap: str,
    topic: str,
    group: str,
    table: Path,
    log: Path,
    ends: Mapping[int, int],
    allowed_latency: int = 10,
) -> KdiRun:
    from deltalake import write_deltalake

    write_deltalake(str(table), kdi_table_schema().empty_table())
    argv = [
        str(binary),
        "ingest",
        topic,
        str(table),
        *("--kafka", bootstrap, "--consumer_group", group, "--app_id", group),
        *("--auto_offset_reset", "earliest", "--ends_at_latest_offsets"),
        *("--transform", "partition: kafka.partition", "--transform", "offset: kafka.offset"),
        *("--allowed_latency", str(allowed_latency), "--max_messages_per_batch", "1000000"),
        *("--min_bytes_per_file", str(128 * 1024 * 1024)),
    ]
    watcher = _EndWatcher(binary, bootstrap, topic, group, table, ends)
    watcher.start()
    watcher.began = time.time()
    try:
        measured = run_measured(argv, log=log, timeout=3600, env={**os.environ, "RUST_LOG": "info"})
    finally:
        watcher.stop.set()
        watcher.join()
    if watcher.error is not None:
        raise RuntimeError(f"kdi: producing the end records failed: {watcher.error}")

    def since_start(when: float | None) -> float | None:
        return None if when is None else when - watcher.began

    return KdiRun(
        measured,
        since_start(watcher.complete_at),
        watcher.complete_cpu,
        since_start(watcher.ended_at),
    )
