"""Many topics through one supervisor: ``--topics`` N topics x ``--partitions`` P, one
worker process per partition, on one Apache Kafka node of the harness.

1. ``KafkaCluster(1)``; N topics named ``<prefix>.tNNNN`` with P partitions each; every
   partition gets ``--idle-records`` JSON records (100 B, as the other benches'); the first
   ``--busy`` topics get a steady ``--rate`` records/s in all (a producer thread in this
   process, round robin over their partitions, from step 3 on), the rest stay idle.
2. One supervisor: ``python -m ingest.cli run -c <generated>.toml`` (continuous), a
   subprocess so that its process tree can be measured alone: ``[source] topic_pattern`` =
   the prefix, ``metadata_refresh = 5s``, ``[spark] engine = "local"`` (no JVM), a local
   Delta table, ``trigger.max_age = --trigger``; the rest the product's defaults (classic
   protocol, cooperative-sticky, ``fetch.max_wait`` 0.5 s, shm handoff). ``--nofile`` sets
   the supervisor's soft RLIMIT_NOFILE (its workers inherit it) to see what a small
   ``ulimit -n`` does.
3. Once every partition has a live worker (the tree's ``ingest-worker`` processes, and a
   ``worker_started`` logged for each partition), ``--settle`` seconds, then ``--window``
   seconds of samples from /proc every ``--sample`` seconds: processes per kind, the sum of
   VmRSS and of Pss (``/proc/<pid>/smaps_rollup``: shared pages split between their users,
   the honest figure with a fork server), open fds, threads, CPU % (user + system ticks over
   the window, 100 % = one core) of the tree and of the broker, the tree's processes in
   state R (running or waiting for a core) against the machine's; rows/s landed (the
   table's rows, from its add actions' ``num_records``, at the window's end less at its
   start, over the window) against rows/s produced, and the records produced but not in the
   table at the window's start and end: whether it keeps up. The steady producer starts
   once every worker is up (no backlog from the start), and the window once ``--settle``
   seconds passed and the first batch made the table.
4. A new matching topic (P partitions) is created and one record produced to it; the time
   from the start of its creation until a row of it is in the Delta table (this process
   reads each new data file's ``topic`` column), with when the supervisor logged its
   assignment and its worker's start.
5. SIGTERM, the seconds to exit and the exit code; any process of the tree still alive
   after (an orphaned worker) is reported and killed.

Safety: a thread reads /proc/meminfo every second; when MemAvailable drops below
``--min-free-gib`` (4) the run is stopped (SIGTERM, then SIGKILL of the whole tree after 30 s)
and reported as aborted. ``--max-load L``: wait (polling every 30 s, at most
``--load-wait`` s) until the 1-minute load average is below L before starting.

    .venv/bin/python scripts/bench/many_topics.py --topics 10
    .venv/bin/python scripts/bench/many_topics.py --topics 200 --max-load 2.5

The last line is ``RESULT topics=N partitions=.. workers=.. pss_mib=.. rss_mib=.. fds=..
threads=.. cpu_pct=.. worker_pss_mib=.. worker_fds=.. supervisor_fds=.. rows_per_s=..
new_topic_first_row_s=.. stop_s=.. exit=..`` (``aborted=<why>`` instead when stopped early).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import ROOT, ingest_argv, json_value, load_average, machine, write_config

from ingest.testing import KafkaCluster, create_topic, unique_name
from ingest.testing.faults import ProcessInfo, kill, process_tree

_CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 2**20


# -- /proc ------------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # the process is gone, or not ours to read
        return None


def _field_kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def mem_available() -> int:
    return _field_kib(_read("/proc/meminfo") or "", "MemAvailable:") * 1024


def open_files_limit(pid: int) -> str:
    """The soft and hard 'Max open files' of a process, from /proc/<pid>/limits."""
    for line in (_read(f"/proc/{pid}/limits") or "").splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return f"{soft}/{hard}"
    return "?"


@dataclass(frozen=True)
class Proc:
    """One process at one sample."""

    pid: int
    start: int  # start time in ticks: with pid, the process's identity
    kind: str
    rss: int
    pss: int
    fds: int
    threads: int
    cpu_ticks: int
    runnable: bool  # state R at the sample


def _kind(info: ProcessInfo, root: int) -> str:
    if info.pid == root:
        return "supervisor"
    kind = info.kind
    if kind in ("worker", "task", "jvm"):
        return kind
    if "forkserver" in info.cmdline:
        return "fork server"
    if "resource_tracker" in info.cmdline:
        return "resource tracker"
    return "other"


def sample_process(pid: int, kind: str) -> Proc | None:
    stat = _read(f"/proc/{pid}/stat")
    status = _read(f"/proc/{pid}/status")
    rollup = _read(f"/proc/{pid}/smaps_rollup")
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    if stat is None or status is None or rollup is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return Proc(
        pid=pid,
        start=int(fields[19]),
        kind=kind,
        rss=_field_kib(status, "VmRSS:") * 1024,
        pss=_field_kib(rollup, "Pss:") * 1024,
        fds=fds,
        threads=_field_kib(status, "Threads:"),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        runnable=fields[0] == "R",
    )


@dataclass
class Sample:
    at: float
    procs: list[Proc]

    def of(self, kind: str | None = None) -> list[Proc]:
        return [p for p in self.procs if kind is None or p.kind == kind]

    def total(self, attr: str, kind: str | None = None) -> int:
        return sum(getattr(p, attr) for p in self.of(kind))


def sample_tree(root: int) -> Sample:
    procs = []
    for info in process_tree(root):
        proc = sample_process(info.pid, _kind(info, root))
        if proc is not None:
            procs.append(proc)
    return Sample(time.monotonic(), procs)


def cpu_percent(first: Sample, last: Sample, kind: str | None = None) -> float:
    """CPU % (100 = one core) between two samples, over the processes alive at both."""
    before = {(p.pid, p.start): p.cpu_ticks for p in first.of(kind)}
    spent = sum(
        p.cpu_ticks - before[(p.pid, p.start)] for p in last.of(kind) if (p.pid, p.start) in before
    )
    seconds = last.at - first.at
    return 100.0 * spent / _CLK_TCK / seconds if seconds > 0 else 0.0


# -- the guard --------------------------------------------------------------------------------


class MemoryGuard:
    """Stops the run when MemAvailable drops below ``floor`` bytes: SIGTERM to the
    supervisor, and 30 s later SIGKILL to every process of its tree still there."""

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.lowest = mem_available()
        self.tripped: str | None = None
        self.root: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-guard", daemon=True)

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            available = mem_available()
            self.lowest = min(self.lowest, available)
            if available < self.floor and self.tripped is None:
                self.tripped = f"MemAvailable {available / 2**30:.2f} GiB < {self.floor / 2**30:g}"
                print(f"# ABORT: {self.tripped}; stopping the supervisor", flush=True)
                if self.root is not None:
                    stop_tree(self.root, grace=30)

    def check(self) -> None:
        if self.tripped is not None:
            raise Aborted(self.tripped)


class Aborted(Exception):
    pass


def stop_tree(root: int, grace: float) -> tuple[float | None, list[int]]:
    """SIGTERM to ``root``; after ``grace`` seconds SIGKILL to whatever of its tree is left.
    Returns the seconds it took to exit (None if killed) and the pids killed."""
    pids = [p.pid for p in process_tree(root)]
    began = time.monotonic()
    try:
        os.kill(root, signal.SIGTERM)
    except ProcessLookupError:
        return 0.0, []
    deadline = began + grace
    while time.monotonic() < deadline:
        if not _alive(root):
            return time.monotonic() - began, []
        time.sleep(0.1)
    return None, kill([*process_tree(root), *pids])


def _alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return stat is not None and stat[stat.rindex(")") + 2] != "Z"


# -- the log ----------------------------------------------------------------------------------


class Log:
    """The supervisor's JSON log (its workers' lines too), read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""
        self.events: list[dict[str, Any]] = []
        self.other: list[str] = []  # lines that are not JSON (tracebacks, native code)

    def read(self) -> list[dict[str, Any]]:
        with open(self.path, errors="replace") as handle:
            handle.seek(self._offset)
            text = handle.read()
            self._offset = handle.tell()
        text, self._partial = self._partial + text, ""
        lines = text.split("\n")
        if not text.endswith("\n"):
            self._partial = lines.pop()
        fresh = []
        for line in lines:
            if line.startswith("{"):
                try:
                    fresh.append(json.loads(line))
                    continue
                except ValueError:
                    pass
            if line.strip():
                self.other.append(line)
        self.events.extend(fresh)
        return fresh

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    def problems(self, limit: int = 12) -> list[str]:
        """The errors and warnings logged, and other output, newest last."""
        found = [
            f"{e.get('level')} {e.get('event') or ''} {e.get('error') or e.get('msg') or ''}"
            for e in self.events
            if str(e.get("level", "")).lower() in ("error", "warning", "critical")
        ]
        return (found + self.other)[-limit:]


def when(entry: dict[str, Any]) -> float:
    """A log line's time, as ``time.time()``."""
    return datetime.fromisoformat(str(entry["ts"])).timestamp()


# -- producing --------------------------------------------------------------------------------


def producer_for(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": False,
            "queue.buffering.max.messages": 1_000_000,
        }
    )


def seed(bootstrap: str, topics: Iterable[str], partitions: int, per_partition: int) -> int:
    """``per_partition`` records to every partition of every topic; returns the count."""
    producer = producer_for(bootstrap)
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    sent = 0
    now_ms = time.time_ns() // 1_000_000
    for topic in topics:
        for partition in range(partitions):
            for _ in range(per_partition):
                producer.produce(
                    topic, json_value(sent, now_ms), partition=partition, on_delivery=delivered
                )
                sent += 1
        producer.poll(0)
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"seed: {left} undelivered, errors: {errors[:3]}")
    return sent


@dataclass
class SteadyProducer:
    """``rate`` records/s in all, round robin over the partitions of ``topics``, on a thread."""

    bootstrap: str
    topics: list[str]
    partitions: int
    rate: int
    first_id: int
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        producer = producer_for(self.bootstrap)
        targets = [(t, p) for t in self.topics for p in range(self.partitions)]
        if not targets or self.rate <= 0:  # --busy 0: every topic idle
            return

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self.errors.append(str(err))

        began = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - began) * self.rate) - self.sent
            now_ms = time.time_ns() // 1_000_000
            for _ in range(max(0, due)):
                topic, partition = targets[self.sent % len(targets)]
                record_id = self.first_id + self.sent
                producer.produce(
                    topic, json_value(record_id, now_ms), partition=partition, on_delivery=delivered
                )
                self.sent += 1
            producer.poll(0)
            self._stop.wait(0.01)
        producer.flush(30)


# -- the table --------------------------------------------------------------------------------


class TopicWatcher:
    """Reads each data file the table gains once (its ``topic`` column only)."""

    def __init__(self, uri: Path) -> None:
        self.uri = str(uri)
        self.table: Any = None
        self.files: set[str] = set()

    def fresh_topics(self) -> set[str]:
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        if self.table is None:
            if not DeltaTable.is_deltatable(self.uri):
                return set()
            self.table = DeltaTable(self.uri)
        else:
            self.table.update_incremental()
        topics: set[str] = set()
        for uri in self.table.file_uris():
            if uri not in self.files:
                self.files.add(uri)
                topics.update(pq.read_table(uri, columns=["topic"]).column("topic").to_pylist())
        return topics


def table_rows(uri: Path) -> int:
    """Rows in the table, from its add actions' statistics (no data file read)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0)


def table_rows_or_none(uri: Path) -> int | None:
    """``table_rows``, or None while the table has no commit yet."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return table_rows(uri)
    except TableNotFoundError:
        return None


# -- the run ----------------------------------------------------------------------------------


def wait_for_load(limit: float, patience: float) -> None:
    deadline = time.monotonic() + patience
    while True:
        one = float(load_average().split()[0])
        if one < limit:
            print(f"# load {one:.2f} < {limit:g}: starting", flush=True)
            return
        if time.monotonic() >= deadline:
            print(f"# load still {one:.2f} >= {limit:g} after {patience:.0f}s: not run")
            print(f"RESULT aborted=load_{one:.2f}")
            sys.exit(3)
        print(f"# load {one:.2f} >= {limit:g}: waiting 30 s", flush=True)
        time.sleep(30)


def set_nofile(limit: int | None) -> Any:
    if limit is None:
        return None

    def apply() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    return apply


class Run:
    def __init__(self, args: argparse.Namespace, workdir: Path, kafka: KafkaCluster) -> None:
        self.args = args
        self.workdir = workdir
        self.kafka = kafka
        self.bootstrap = kafka.bootstrap
        self.prefix = unique_name("many")
        self.expected = args.topics * args.partitions
        self.table = workdir / "table"
        self.log = Log(workdir / "ingest.log")
        self.figures: dict[str, Any] = {"topics": args.topics, "partitions": self.expected}
        self.process: subprocess.Popen[bytes] | None = None

    def topic(self, n: int) -> str:
        return f"{self.prefix}.t{n:04d}"

    def check_alive(self, guard: MemoryGuard) -> None:
        guard.check()
        assert self.process is not None
        if self.process.poll() is not None:
            self.log.read()
            raise Aborted(f"ingest exited {self.process.returncode}")

    def setup_topics(self) -> None:
        args = self.args
        began = time.monotonic()
        for n in range(args.topics):
            create_topic(self.bootstrap, self.topic(n), partitions=args.partitions, timeout=60)
        created = time.monotonic() - began
        seeded = seed(
            self.bootstrap,
            (self.topic(n) for n in range(args.topics)),
            args.partitions,
            args.idle_records,
        )
        self.figures["create_s"] = created
        self.seeded = seeded
        print(
            f"# {args.topics} topics x {args.partitions} partitions created in {created:.1f}s; "
            f"{seeded} records seeded",
            flush=True,
        )

    def start_supervisor(self) -> None:
        args = self.args
        config = write_config(
            self.workdir / "run.toml",
            bootstrap=self.bootstrap,
            topic="unused",
            group=unique_name("many-topics"),
            table=self.table,
            sections={
                "source": {
                    "topics": [],
                    "topic_pattern": re.escape(self.prefix) + r"\..+",
                    "metadata_refresh": "5s",
                },
                "spark": {"engine": "local"},
                "trigger": {"max_age": f"{args.trigger:g}s"},
                **({"fetch": {"min_bytes": args.fetch_min_bytes}} if args.fetch_min_bytes else {}),
            },
        )
        out = open(self.log.path, "w")  # noqa: SIM115 (closed in stop)
        self._out = out
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            ingest_argv(config),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            preexec_fn=set_nofile(args.nofile),
        )

    def workers_up(self) -> tuple[int, int]:
        """(live worker processes, partitions with a worker_started logged)."""
        assert self.process is not None
        workers = sum(1 for p in process_tree(self.process.pid) if p.kind == "worker")
        self.log.read()
        started = {e.get("partition") for e in self.log.named("worker_started")}
        return workers, len(started)

    def wait_all_up(self, guard: MemoryGuard) -> None:
        deadline = time.monotonic() + self.args.up_timeout
        last_print = 0.0
        while True:
            self.check_alive(guard)
            workers, started = self.workers_up()
            if workers >= self.expected and started >= self.expected:
                break
            now = time.monotonic()
            if now > deadline:
                raise Aborted(
                    f"only {workers} workers alive, {started} started of {self.expected} "
                    f"after {self.args.up_timeout:g}s"
                )
            if now - last_print > 10:
                print(
                    f"# {now - self.started_at:5.1f}s: {workers} workers alive, "
                    f"{started}/{self.expected} started; "
                    f"MemAvailable {mem_available() / 2**30:.1f} GiB",
                    flush=True,
                )
                last_print = now
            time.sleep(0.5)
        self.figures["all_up_s"] = time.monotonic() - self.started_at
        print(f"# all {self.expected} workers up {self.figures['all_up_s']:.1f}s after start")

    def measure(self, guard: MemoryGuard, producer: SteadyProducer) -> None:
        assert self.process is not None
        root = self.process.pid
        broker = self.kafka.pid
        assert broker is not None
        # Settled: --settle seconds passed and the first batch made the table.
        end = time.monotonic() + self.args.settle
        deadline = end + self.args.up_timeout
        while time.monotonic() < end or not (self.table / "_delta_log").is_dir():
            self.check_alive(guard)
            if time.monotonic() > deadline:
                raise Aborted(f"no table after {self.args.up_timeout:g}s")
            time.sleep(0.5)
        while table_rows_or_none(self.table) is None:
            self.check_alive(guard)
            time.sleep(0.5)
        samples: list[Sample] = []
        brokers: list[Sample] = []
        samples_running: list[int] = []
        began_wall = time.time()
        sent_before = producer.sent
        rows_before = table_rows(self.table)
        behind_start = self.seeded + producer.sent - rows_before
        end = time.monotonic() + self.args.window
        while True:
            self.check_alive(guard)
            samples.append(sample_tree(root))
            samples_running.append(
                int((_read("/proc/loadavg") or "0 0 0 0/0").split()[3].split("/")[0])
            )
            proc = sample_process(broker, "broker")
            brokers.append(Sample(time.monotonic(), [proc] if proc else []))
            if time.monotonic() >= end:
                break
            time.sleep(self.args.sample)
        ended_wall = time.time()
        sent = producer.sent - sent_before
        rows_after = table_rows(self.table)
        behind_end = self.seeded + producer.sent - rows_after
        self.log.read()
        commits = [
            e for e in self.log.named("batch_committed") if began_wall <= when(e) <= ended_wall
        ]
        first, last = samples[0], samples[-1]
        seconds = ended_wall - began_wall
        # Rows landed per second: the table's rows at the window's end less at its start, over
        # the window (so up to a batch, ``trigger`` seconds of data, off at either edge).
        landed_rate = (rows_after - rows_before) / seconds
        peak = max(samples, key=lambda s: s.total("pss"))
        kinds = sorted({p.kind for s in samples for p in s.procs}, key=KIND_ORDER.index)
        by_kind = {}
        for kind in kinds:
            by_kind[kind] = {
                "processes": max(len(s.of(kind)) for s in samples),
                "rss": max(s.total("rss", kind) for s in samples),
                "pss": max(s.total("pss", kind) for s in samples),
                "fds": max(s.total("fds", kind) for s in samples),
                "threads": max(s.total("threads", kind) for s in samples),
                "cpu": cpu_percent(first, last, kind),
            }
        workers = [len(s.of("worker")) for s in samples]
        supervisor = [p for p in last.procs if p.kind == "supervisor"]
        fork_server = [p for p in last.procs if p.kind == "fork server"]
        b_last = brokers[-1].procs[0] if brokers[-1].procs else None
        worker_count = max(min(workers), 1)
        self.figures.update(
            workers=min(workers),
            workers_max=max(workers),
            processes=max(len(s.procs) for s in samples),
            rss=max(s.total("rss") for s in samples),
            pss=peak.total("pss"),
            fds=max(s.total("fds") for s in samples),
            threads=max(s.total("threads") for s in samples),
            # Processes of the tree running or waiting for a core, mean over the samples,
            # against every runnable task of the machine (/proc/loadavg's 4th field).
            runnable=sum(s.total("runnable") for s in samples) / len(samples),
            machine_runnable=sum(samples_running) / len(samples_running),
            cpu=cpu_percent(first, last),
            worker_pss=by_kind.get("worker", {}).get("pss", 0) / worker_count,
            worker_rss=by_kind.get("worker", {}).get("rss", 0) / worker_count,
            worker_fds=by_kind.get("worker", {}).get("fds", 0) / worker_count,
            worker_threads=by_kind.get("worker", {}).get("threads", 0) / worker_count,
            supervisor_fds=max(p.fds for p in supervisor) if supervisor else 0,
            fork_server_fds=max(p.fds for p in fork_server) if fork_server else 0,
            nofile=open_files_limit(root),
            produced_per_s=sent / seconds,
            rows_per_s=landed_rate,
            batches=len(commits),
            behind_start=behind_start,
            behind_end=behind_end,
            window_s=seconds,
            broker_cpu=cpu_percent(brokers[0], brokers[-1]),
            broker_rss=b_last.rss if b_last else 0,
            broker_fds=b_last.fds if b_last else 0,
            broker_threads=b_last.threads if b_last else 0,
            broker_nofile=open_files_limit(broker),
            by_kind=by_kind,
            mem_available_min=guard.lowest,
        )

    def new_topic(self, guard: MemoryGuard) -> None:
        args = self.args
        name = f"{self.prefix}.new"
        watcher = TopicWatcher(self.table)
        watcher.fresh_topics()  # what is there now is not the new topic's
        began_wall = time.time()
        began = time.monotonic()
        create_topic(self.bootstrap, name, partitions=args.partitions, timeout=60)
        producer = producer_for(self.bootstrap)
        producer.produce(name, json_value(99_000_000, time.time_ns() // 1_000_000), partition=0)
        if producer.flush(30):
            raise RuntimeError("the new topic's record was not delivered")
        produced = time.monotonic() - began
        deadline = began + args.new_topic_timeout
        while name not in watcher.fresh_topics():
            self.check_alive(guard)
            if time.monotonic() > deadline:
                raise Aborted(f"no row of {name} after {args.new_topic_timeout:g}s")
            time.sleep(0.2)
        first_row = time.monotonic() - began
        self.log.read()
        assigned = [
            when(e) - began_wall
            for e in self.log.named("partitions_assigned")
            if name in str(e.get("new", ""))
        ]
        started = [
            when(e) - began_wall
            for e in self.log.named("worker_started")
            if str(e.get("partition", "")).startswith(name + "-")
        ]
        self.figures.update(
            new_topic_produced_s=produced,
            new_topic_assigned_s=min(assigned) if assigned else None,
            new_topic_worker_s=min(started) if started else None,
            new_topic_first_row_s=first_row,
        )
        assert self.process is not None
        self.figures["workers_after"] = sum(
            1 for p in process_tree(self.process.pid) if p.kind == "worker"
        )

    def stop(self) -> None:
        if self.process is None:
            return
        pids = {p.pid: p for p in process_tree(self.process.pid)}
        if self.process.poll() is None:
            seconds, killed = stop_tree(self.process.pid, grace=self.args.stop_timeout)
            self.figures["stop_s"] = seconds
            self.figures["killed_at_stop"] = len(killed)
        self.process.wait()
        self.figures["exit"] = self.process.returncode
        self._out.close()
        # Whatever of the tree outlived the supervisor (an orphan is reparented, so look by pid).
        time.sleep(1.0)
        left = [
            info
            for info in pids.values()
            if _alive(info.pid) and (_read(f"/proc/{info.pid}/cmdline") or "") != ""
        ]
        left = [i for i in left if (_read(f"/proc/{i.pid}/comm") or "").strip() == i.name]
        self.figures["left_after_stop"] = len(left)
        if left:
            print(f"# {len(left)} processes of the tree outlived it: {[i.pid for i in left]}")
            kill(left)


KIND_ORDER = [
    "supervisor",
    "fork server",
    "resource tracker",
    "worker",
    "task",
    "jvm",
    "other",
]


def mib(size: float) -> float:
    return size / MIB


def report(figures: dict[str, Any], aborted: str | None) -> None:
    f = figures
    print()
    by_kind = f.get("by_kind") or {}
    if by_kind:
        print(
            f"{'kind':>17} {'procs':>6} {'RSS MiB':>9} {'PSS MiB':>9} {'fds':>6} "
            f"{'threads':>8} {'CPU %':>6}"
        )
        for kind, k in by_kind.items():
            print(
                f"{kind:>17} {k['processes']:6} {mib(k['rss']):9.0f} {mib(k['pss']):9.0f} "
                f"{k['fds']:6} {k['threads']:8} {k['cpu']:6.1f}"
            )
        print(
            f"{'tree':>17} {f['processes']:6} {mib(f['rss']):9.0f} {mib(f['pss']):9.0f} "
            f"{f['fds']:6} {f['threads']:8} {f['cpu']:6.1f}"
        )
        print(
            f"{'broker (JVM)':>17} {1:6} {mib(f['broker_rss']):9.0f} {'':>9} "
            f"{f['broker_fds']:6} {f['broker_threads']:8} {f['broker_cpu']:6.1f}"
        )
        print("(max over the window's samples per column; CPU over the window, 100 = one core)")
        print()
    lines = [
        ("topics x partitions", f"{f['topics']} topics, {f['partitions']} partitions"),
        ("topics created in", _s(f.get("create_s"))),
        ("all workers up after", _s(f.get("all_up_s"))),
        ("workers alive (window)", f"{f.get('workers', '?')} - {f.get('workers_max', '?')}"),
        (
            "per worker",
            f"PSS {mib(f['worker_pss']):.1f} MiB, RSS {mib(f['worker_rss']):.1f} MiB, "
            f"{f['worker_fds']:.1f} fds, {f['worker_threads']:.1f} threads"
            if "worker_pss" in f
            else "?",
        ),
        ("supervisor fds (own)", f"{f.get('supervisor_fds', '?')} (limit {f.get('nofile', '?')})"),
        ("fork server fds", str(f.get("fork_server_fds", "?"))),
        ("broker limit (nofile)", str(f.get("broker_nofile", "?"))),
        (
            "rows/s landed / produced",
            f"{f['rows_per_s']:,.0f} / {f['produced_per_s']:,.0f} over {f['window_s']:.0f}s "
            f"({f['batches']} batches)"
            if "rows_per_s" in f
            else "?",
        ),
        (
            "produced, not in the table",
            f"{f['behind_start']:,} at the window's start, {f['behind_end']:,} at its end"
            if "behind_end" in f
            else "?",
        ),
        ("new topic: produced", _s(f.get("new_topic_produced_s"))),
        ("new topic: assigned (log)", _s(f.get("new_topic_assigned_s"))),
        ("new topic: worker started", _s(f.get("new_topic_worker_s"))),
        ("new topic: first row", _s(f.get("new_topic_first_row_s"))),
        ("workers after new topic", str(f.get("workers_after", "?"))),
        ("stop (SIGTERM to exit)", f"{_s(f.get('stop_s'))}, exit {f.get('exit', '?')}"),
        ("processes left after stop", str(f.get("left_after_stop", "?"))),
        (
            "runnable (R), mean",
            f"{f['runnable']:.1f} of the tree, {f['machine_runnable']:.1f} on the machine"
            if "runnable" in f
            else "?",
        ),
        ("lowest MemAvailable", f"{f.get('mem_available_min', 0) / 2**30:.1f} GiB"),
    ]
    for name, value in lines:
        print(f"{name:>27}: {value}")
    if aborted:
        print(f"RESULT topics={f['topics']} aborted={aborted.replace(' ', '_')}")
        return
    print(
        f"RESULT topics={f['topics']} partitions={f['partitions']} workers={f['workers']} "
        f"pss_mib={mib(f['pss']):.0f} rss_mib={mib(f['rss']):.0f} fds={f['fds']} "
        f"threads={f['threads']} cpu_pct={f['cpu']:.1f} worker_pss_mib={mib(f['worker_pss']):.1f} "
        f"worker_fds={f['worker_fds']:.1f} supervisor_fds={f['supervisor_fds']} "
        f"rows_per_s={f['rows_per_s']:.0f} "
        f"new_topic_first_row_s={f['new_topic_first_row_s']:.2f} "
        f"stop_s={(f.get('stop_s') or float('nan')):.2f} exit={f.get('exit')}"
    )


def _s(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=2, help="per topic")
    parser.add_argument("--busy", type=int, default=10, help="topics with a steady rate")
    parser.add_argument("--rate", type=int, default=1500, help="records/s over the busy topics")
    parser.add_argument("--idle-records", type=int, default=5, help="per partition at start")
    parser.add_argument("--trigger", type=float, default=5.0, help="trigger.max_age, s")
    parser.add_argument("--settle", type=float, default=15.0, help="s after all are up")
    parser.add_argument("--window", type=float, default=60.0, help="s of samples")
    parser.add_argument("--sample", type=float, default=4.0, help="s between samples")
    parser.add_argument("--nofile", type=int, help="the supervisor's soft RLIMIT_NOFILE")
    parser.add_argument(
        "--fetch-min-bytes", help='fetch.min_bytes, e.g. "64KiB" (default: the product\'s)'
    )
    parser.add_argument("--min-free-gib", type=float, default=4.0)
    parser.add_argument("--max-load", type=float, help="wait for a 1-min load below this")
    parser.add_argument("--load-wait", type=float, default=900.0)
    parser.add_argument("--up-timeout", type=float, default=600.0)
    parser.add_argument("--new-topic-timeout", type=float, default=180.0)
    parser.add_argument("--stop-timeout", type=float, default=120.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()

    if args.max_load is not None:
        wait_for_load(args.max_load, args.load_wait)
    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-many-topics-"))
    print(f"# {machine()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"# load average before: {load_average()}; ulimit -n here: {open_files_limit(os.getpid())}"
    )
    print(
        f"# {args.topics} topics x {args.partitions}, {args.busy} busy at {args.rate} records/s "
        f"in all, {args.idle_records} records per partition at start; trigger {args.trigger:g}s; "
        f"nofile {args.nofile or 'inherited'}; work dir {workdir}",
        flush=True,
    )
    aborted: str | None = None
    figures: dict[str, Any] = {"topics": args.topics}
    try:
        with KafkaCluster(1) as kafka, MemoryGuard(int(args.min_free_gib * 2**30)) as guard:
            run = Run(args, workdir, kafka)
            figures = run.figures
            producer: SteadyProducer | None = None
            try:
                run.setup_topics()
                guard.check()
                busy = [run.topic(n) for n in range(min(args.busy, args.topics))]
                producer = SteadyProducer(
                    kafka.bootstrap, busy, args.partitions, args.rate, first_id=10_000_000
                )
                run.start_supervisor()
                assert run.process is not None
                guard.root = run.process.pid
                run.wait_all_up(guard)
                producer.start()  # now: no backlog built while the workers start
                run.measure(guard, producer)
                run.new_topic(guard)
            except Aborted as exc:
                aborted = str(exc)
                print(f"# ABORTED: {aborted}", flush=True)
            except Exception as exc:  # the bench's own failure: reported, the tree stopped
                traceback.print_exc()
                aborted = f"{type(exc).__name__}: {exc}"
            finally:
                if producer is not None:
                    producer.stop()
                run.stop()
                for line in run.log.problems():
                    print(f"# log: {line[:300]}")
            figures["mem_available_min"] = guard.lowest
            print(f"# load average after: {load_average()}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report(figures, aborted)
    if aborted:
        sys.exit(1)


if __name__ == "__main__":
    main()
