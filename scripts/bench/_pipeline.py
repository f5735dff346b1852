"""Shared pieces of the end-to-end benchmarks (e2e, scaling, latency).

* the records: 100-byte JSON values whose ``id`` is ``partition * per_partition + n``,
  so any row's value can be checked against its (partition, offset);
* ``TreeSampler``: peak memory and CPU of a process and all its descendants, from /proc
  (no psutil): the sum of VmRSS at each sample (shared pages counted once per process,
  so an over-estimate), the sum of Pss (shared pages split between their users), and the
  CPU seconds of every process seen;
* ``run_ingest``: the real ``ingest`` CLI as a subprocess with a generated TOML config
  (as tests/runtime/support.py does), its JSON log kept in a file;
* ``check_exact``: a Delta table against what was produced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.formats.decode import DecodeSpec
from ingest.testing import unique_name
from ingest.testing.configs import write_toml

ROOT = Path(__file__).resolve().parents[2]
VALUE_BYTES = 100
VALUE_DDL = "id BIGINT, user STRING, amount DOUBLE, kind STRING, ts BIGINT, pad STRING"
# What Spark makes of VALUE_DDL (ingest.engines.spark.job.decode_spec); the peers write the same.
VALUE_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("user", pa.string()),
        ("amount", pa.float64()),
        ("kind", pa.string()),
        ("ts", pa.int64()),
        ("pad", pa.string()),
    ]
)
OUTPUT_SCHEMA = DecodeSpec("json", VALUE_SCHEMA).output_schema()
KINDS = (b"view", b"click", b"purchase", b"refund")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# -- records ---------------------------------------------------------------------------------


def json_value(record_id: int, ts_ms: int, size: int = VALUE_BYTES) -> bytes:
    """A JSON object of exactly ``size`` bytes (ids below 10**8, ``size`` >= 100)."""
    head = b'{"id":%d,"user":"user-%05d","amount":%d.%02d,"kind":"%s","ts":%d,"pad":"' % (
        record_id,
        record_id % 50_000,
        record_id % 10_000,
        record_id % 100,
        KINDS[record_id % 4],
        ts_ms,
    )
    return head + b"x" * (size - len(head) - 2) + b'"}'


def warm_topic(bootstrap: str, topic: str, ends: Mapping[int, int]) -> float:
    """Reads the whole topic once, untimed, with librdkafka (no group); returns the
    seconds. The first reader of a freshly written topic met a colder broker (its fetch
    path's first use, the new segments) than those after it: whichever pipeline ran first
    paid ~0.2-0.3 s of it at 100k. A user's cluster serves reads all day."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-warm", "enable.auto.commit": False}
    )
    began = time.monotonic()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        total, seen = sum(ends.values()), 0
        while seen < total:
            messages = consumer.consume(10_000, 1.0)
            errors = [m.error() for m in messages if m.error() is not None]
            if errors:
                raise RuntimeError(f"warming {topic}: {errors[0]}")
            seen += len(messages)
            if time.monotonic() - began > 300:
                raise RuntimeError(f"warming {topic}: {seen} of {total} in 300 s")
    finally:
        consumer.close()
    return time.monotonic() - began


def warm_group_coordinator(bootstrap: str, timeout: float = 60) -> float:
    """Has the broker create ``__consumer_offsets`` and load its coordinators before any
    pipeline is timed; returns the seconds it took. A fresh broker does that at the first
    group's FindCoordinator, so whichever pipeline ran first paid it (0.2 s of ours at 100k);
    a user's cluster has had its offsets topic since its first group."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    began = time.monotonic()
    while True:
        group = "ingest-bench-warm-up"
        try:
            admin.describe_consumer_groups([group])[group].result(timeout=10)
            return time.monotonic() - began
        except Exception:
            if time.monotonic() - began > timeout:
                raise
            time.sleep(0.1)


def await_leaders(producer: Any, topic: str, partitions: int, timeout: float = 30) -> None:
    """Waits until the producer knows a leader for each partition of a topic just created.
    Records produced before that wait in librdkafka's unassigned queue and may be sent
    after later ones (measured: partition 0 of a fresh topic held ids 8471.. at offsets
    0.., then 0..8470), even with one request in flight."""
    deadline = time.monotonic() + timeout
    while True:
        found = producer.list_topics(topic, timeout=5).topics.get(topic)
        known = found is not None and found.error is None and len(found.partitions) == partitions
        if known and all(p.leader >= 0 for p in found.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: no leader for every partition after {timeout:g}s")
        time.sleep(0.1)


def produce_json(
    bootstrap: str,
    topic: str,
    partitions: int,
    per_partition: int,
    value_bytes: int = VALUE_BYTES,
    *,
    idempotent: bool = False,
    encode: Callable[[int, int, int], bytes] = lambda i, ts, size: json_value(i, ts, size),
) -> float:
    """Produces ``per_partition`` records of ``value_bytes`` to each partition
    (non-idempotent, as the harness's crash-safe setting, unless ``idempotent``: librdkafka
    then keeps each partition's order through retries, which one request in flight alone
    did not on a new topic's first requests in namespace hosts); returns the seconds it
    took. ``encode(id, ts_ms, value_bytes)``: a record's value (default: its JSON)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "enable.idempotence": idempotent,
            # One request in flight: a retried batch (the topic's leader still unknown just
            # after its creation) cannot land behind later ones and shift the offsets.
            "max.in.flight.requests.per.connection": 1,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    await_leaders(producer, topic, partitions)
    began = time.perf_counter()
    for partition in range(partitions):
        base = partition * per_partition
        now_ms = time.time_ns() // 1_000_000
        for n in range(per_partition):
            value = encode(base + n, now_ms, value_bytes)
            key = b"k%07d" % (n % 1_000_000)
            while True:
                try:
                    producer.produce(topic, value, key, partition, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            if n % 50_000 == 0:
                producer.poll(0)
                now_ms = time.time_ns() // 1_000_000
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"produce: {left} undelivered, errors: {errors[:3]}")
    return time.perf_counter() - began


# -- process tree sampling -------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # the process is gone
        return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        if stat is None:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found = [root]
    for pid in found:
        found.extend(children.get(pid, ()))
    return found


def _status_kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


@dataclass
class TreeSampler:
    """Samples ``root`` and its descendants every ``interval`` seconds on a thread."""

    root: int
    interval: float = 0.25
    pss: bool = True
    peak_rss: int = 0
    peak_pss: int = 0
    peak_processes: int = 0
    # At the sample of peak RSS: RSS by process kind, and the tree's RSS by kind of page
    # (anon, file, shmem: the handoff's segments in /dev/shm count in each mapper's RSS).
    rss_at_peak: dict[str, int] = field(default_factory=dict)
    _cpu: dict[tuple[int, int], float] = field(default_factory=dict)
    _kind: dict[tuple[int, int], str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, name="tree-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        rss = pss = count = 0
        detail: dict[str, int] = {}
        for pid in _descendants(self.root):
            stat = _read(f"/proc/{pid}/stat")
            status = _read(f"/proc/{pid}/status")
            if stat is None or status is None:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            start_ticks = int(fields[19])
            # Own user + system time only: a child's is counted from its own samples.
            self._cpu[(pid, start_ticks)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
            # Every sample: a process may exec another program (spark-submit execs java).
            # An exited one not reaped yet (a zombie) has no command line: keep its kind.
            cmdline = _read(f"/proc/{pid}/cmdline") or ""
            if cmdline or (pid, start_ticks) not in self._kind:
                self._kind[(pid, start_ticks)] = _process_kind(cmdline)
            own = _status_kib(status, "VmRSS:") * 1024
            rss += own
            kind = self._kind[(pid, start_ticks)]
            detail[kind] = detail.get(kind, 0) + own
            for page in ("anon", "file", "shmem"):
                key = f"pages {page}"
                detail[key] = detail.get(key, 0) + _status_kib(status, f"Rss{page.title()}:") * 1024
            count += 1
            if self.pss:
                rollup = _read(f"/proc/{pid}/smaps_rollup")
                pss += _status_kib(rollup or "", "Pss:") * 1024
        if rss > self.peak_rss:
            self.peak_rss, self.rss_at_peak = rss, detail
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, count)

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values())

    def cpu_by_kind(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for key, seconds in self._cpu.items():
            kind = self._kind.get(key, "other")
            spent[kind] = spent.get(kind, 0.0) + seconds
        return dict(sorted(spent.items(), key=lambda item: -item[1]))


def _process_kind(cmdline: str) -> str:
    """A short name for a process of the tree, from its command line."""
    argv = cmdline.split("\0")
    if "java" in argv[0]:
        return "spark jvm"
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "spark python"
    if "multiprocessing" in cmdline:
        return "ingest workers"
    if "ingest.cli" in cmdline:
        return "supervisor"
    if "--peer" in argv:
        return "peer " + argv[argv.index("--peer") + 1]
    return argv[0].rsplit("/", 1)[-1] or "other"


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_rss: int
    peak_pss: int
    cpu_seconds: float
    processes: int
    returncode: int
    cpu_by_kind: Mapping[str, float] = field(default_factory=dict)
    rss_at_peak: Mapping[str, int] = field(default_factory=dict)

    def describe_peak(self) -> str:
        """The peak RSS by process kind and by kind of page, in GiB."""
        parts = [f"{kind} {size / 1024**3:.2f}" for kind, size in self.rss_at_peak.items()]
        return f"peak RSS {self.peak_rss / 1024**3:.2f} GiB: " + ", ".join(parts)


def run_measured(
    argv: Sequence[str], *, log: Path, timeout: float, env: Mapping[str, str] | None = None
) -> Measured:
    """Runs ``argv`` to its end, sampling its process tree; stdout+stderr go to ``log``."""
    with open(log, "w") as out:
        began = time.perf_counter()
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ if env is None else env, PYTHONUNBUFFERED="1"),
        )
        with TreeSampler(process.pid) as sampler:
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise RuntimeError(f"{argv[:4]} ran over {timeout:.0f}s; log: {log}") from None
            seconds = time.perf_counter() - began
    return Measured(
        seconds,
        sampler.peak_rss,
        sampler.peak_pss,
        sampler.cpu_seconds,
        sampler.peak_processes,
        code,
        sampler.cpu_by_kind(),
        dict(sampler.rss_at_peak),
    )


# -- ingest ----------------------------------------------------------------------------------


def write_config(
    path: Path,
    *,
    bootstrap: str,
    topic: str,
    group: str,
    table: Path,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """An ingest config for the bench broker: the product's defaults except a short
    session (Tansu holds a JoinGroup for session/2), local[2] Spark and JSON logs."""
    values: dict[str, dict[str, Any]] = {
        "kafka": {"bootstrap_servers": [bootstrap]},
        "source": {
            "topics": [topic],
            "group_id": group,
            "session_timeout": "6s",
            "heartbeat_interval": "1s",
        },
        "table": {"uri": str(table)},
        "table.value": {"format": "json", "schema": VALUE_DDL},
        "spark": {"master": "local[2]"},
        "logging": {"format": "json", "level": "info"},
    }
    for section, entries in (sections or {}).items():
        values.setdefault(section, {}).update(entries)
    return write_toml(path, values)


def ingest_argv(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ingest.cli", "run", "-c", str(config), *extra]


def log_events(log: Path) -> list[dict[str, Any]]:
    """The JSON log lines of an ingest run (other output skipped)."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


@dataclass(frozen=True)
class RunPhases:
    """Where an ingest run's time went, from its log."""

    spark_start: float | None  # the JVM + session start (overlaps joining and fetching)
    first_batch_at: float | None  # seconds from the first log line to the first batch start
    batches: int
    batch_seconds: float  # summed
    stages: dict[str, float]  # summed per stage
    later_rows: int  # in the batches after the first (a warm session)
    later_seconds: float
    fetch_seconds: float | None  # first worker started to last worker finished

    def describe(self) -> str:
        stages = " ".join(f"{k}={v:.1f}" for k, v in self.stages.items() if k != "total")
        spark = f"{self.spark_start:.1f}s" if self.spark_start is not None else "?"
        first = f"{self.first_batch_at:.1f}s" if self.first_batch_at is not None else "?"
        later = (
            f"; after the first: {self.later_rows / self.later_seconds:,.0f} rows/s"
            if self.later_seconds
            else ""
        )
        fetch = f"{self.fetch_seconds:.1f}s" if self.fetch_seconds is not None else "?"
        return (
            f"workers fetched all in {fetch}; "
            f"spark session start {spark}; first batch at {first}; {self.batches} batches "
            f"{self.batch_seconds:.1f}s ({stages}){later}"
        )


def _when(entry: Mapping[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(entry["ts"])).timestamp()


def run_phases(log: Path) -> RunPhases:
    events = log_events(log)
    spark_start = None
    first_batch = None
    batches = 0
    batch_seconds = 0.0
    stages: dict[str, float] = {}
    later_rows = 0
    later_seconds = 0.0
    worker_times: list[float] = []
    origin = _when(events[0]) if events else 0.0
    for entry in events:
        message = str(entry.get("msg", ""))
        if message.startswith("spark session") and " started in " in message:
            spark_start = float(message.rsplit(" ", 1)[1].rstrip("s"))
        if entry.get("event") in ("worker_started", "worker_finished"):
            worker_times.append(_when(entry))
        if entry.get("event") == "batch_started" and first_batch is None:
            first_batch = _when(entry) - origin
        if entry.get("event") == "batch_committed":
            batches += 1
            batch_seconds += float(entry["seconds"])
            if batches > 1:
                later_rows += int(entry["rows"])
                later_seconds += float(entry["seconds"])
            for stage, spent in dict(entry.get("stages") or {}).items():
                stages[stage] = stages.get(stage, 0.0) + float(spent)
    return RunPhases(
        spark_start,
        first_batch,
        batches,
        batch_seconds,
        stages,
        later_rows,
        later_seconds,
        max(worker_times) - min(worker_times) if worker_times else None,
    )


def ingest_until_end(
    name: str,
    workdir: Path,
    bootstrap: str,
    topic: str,
    ends: Mapping[int, int],
    per: int,
    *,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
    check: Callable[[Path], str | None] | None = None,
    wrap: Sequence[str] = (),
) -> dict[str, Any]:
    """``ingest run --until-end`` into ``workdir/name``, measured and checked exact (or by
    ``check``, which says what is wrong with the table, None when nothing is). ``wrap``:
    a command the run goes under (a profiler's, ending with ``--``)."""
    table = workdir / name
    group = unique_name(name)
    config = write_config(
        workdir / f"{name}.toml",
        bootstrap=bootstrap,
        topic=topic,
        group=group,
        table=table,
        sections=sections,
    )
    log = workdir / f"{name}.log"
    argv = [*wrap, *ingest_argv(config, "--until-end")]
    measured = run_measured(argv, log=log, timeout=1800)
    if measured.returncode != 0:
        raise RuntimeError(f"ingest exited {measured.returncode}; log: {log}")
    problem = check(table) if check is not None else check_exact(table, ends, per)
    dead = dead_letter_rows(f"{table}_dead_letters")
    if dead and problem is None:
        problem = f"{dead} dead letters"
    phases = run_phases(log)
    print(
        f"# {name}: {measured.seconds:.1f}s, exact: {problem or 'yes'}; {phases.describe()}; "
        f"{measured.describe_peak()}",
        flush=True,
    )
    return {
        "m": measured,
        "seconds": measured.seconds,
        "problem": problem,
        "phases": phases,
        "group": group,
    }


# -- checking a table ------------------------------------------------------------------------


def check_exact(
    uri: str | Path,
    per_partition: Mapping[int, int],
    stride: int,
    storage_options: Mapping[str, str] | None = None,
) -> str | None:
    """None when the table holds each offset [0, n) of each partition exactly once, with
    the value produced there (its ``id`` is ``partition * stride + offset``); else why not."""
    from deltalake import DeltaTable

    options = dict(storage_options or {}) or None
    try:
        table = DeltaTable(str(uri), storage_options=options).to_pyarrow_table(
            columns=["partition", "offset", "id"]
        )
    except Exception as exc:
        return f"unreadable: {exc}"
    expected = sum(per_partition.values())
    if table.num_rows != expected:
        return f"{table.num_rows} rows, expected {expected}"
    partitions = table.column("partition").to_numpy()
    offsets = table.column("offset").to_numpy()
    ids = table.column("id").to_numpy(zero_copy_only=False)
    order = np.lexsort((offsets, partitions))
    partitions, offsets, ids = partitions[order], offsets[order], ids[order]
    start = 0
    for partition in sorted(per_partition):
        count = per_partition[partition]
        mine = slice(start, start + count)
        if not (partitions[mine] == partition).all():
            return f"partition {partition}: rows of other partitions in its range"
        if not np.array_equal(offsets[mine], np.arange(count)):
            return f"partition {partition}: offsets are not 0..{count - 1} once each"
        if not np.array_equal(ids[mine], partition * stride + offsets[mine]):
            return f"partition {partition}: a value is not the one produced at its offset"
        start += count
    return None


def dead_letter_rows(uri: str | Path, storage_options: Mapping[str, str] | None = None) -> int:
    from deltalake import DeltaTable

    options = dict(storage_options or {}) or None
    try:
        table = DeltaTable(str(uri), storage_options=options)
        return table.to_pyarrow_table(columns=["offset"]).num_rows
    except Exception:
        return 0  # no dead-letter table: none written


def gib(size: int) -> float:
    return size / 2**30


def machine() -> str:
    cpu = "?"
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory = _status_kib(_read("/proc/meminfo") or "", "MemTotal:") * 1024
    return f"{os.cpu_count()} cores ({cpu}), {gib(memory):.0f} GiB RAM"


def load_average() -> str:
    return " ".join((_read("/proc/loadavg") or "? ? ?").split()[:3])
