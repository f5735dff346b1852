"""``scripts/soak``: continuous ``ingest run`` for N minutes, checked for growth.

    scripts/soak                         5 minutes at 5,000 records/s
    scripts/soak --minutes 60 --rate 20000 --kill-every 120

One Apache Kafka node (started here), a topic of ``--partitions`` partitions and a
producer in this process sending ``--rate`` records/s of 100 bytes, evenly over time.
The real CLI runs continuously (``ingest run``, the local engine, a files handoff in the
work directory). Every ``--kill-every`` seconds one partition worker is SIGKILLed (the
supervisor restarts it), and half way through the broker is restarted once.

Every ``--sample-every`` seconds the run's process tree is sampled: resident memory,
open file descriptors and threads (summed over the tree; threads also by process kind),
and the bytes under the handoff root. The first ``--warm-up`` fraction of the run is left
out; the growth of each is the median of the last fifth of the remaining samples against
the median of its first fifth (handoff bytes against at least one segment's size, as the
handoff swings between empty and a few segments). After the producer stops, the table
must hold every offset of every partition exactly once, and a SIGTERM must end the run
with exit 0.

The last line is ``RESULT minutes=.. rows=.. exact=.. exit=.. kills=.. broker_restarts=..
rss_growth=..% fds_growth=..% threads_growth=..% handoff_growth=..% ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ingest.testing import KafkaCluster, create_topic, unique_name
from ingest.testing.faults import process_tree
from tests.runtime.support import Cli, table_offsets, wait_until, write_config

VALUE_BYTES = 100
SEGMENT_BYTES = 4 * 1024 * 1024
METRICS = ("rss", "fds", "threads", "handoff")


@dataclass(frozen=True)
class Sample:
    seconds: float  # since the run started
    rss: int  # bytes, summed over the process tree
    fds: int
    threads: int
    handoff: int  # bytes under the handoff root
    processes: int
    threads_by_kind: dict[str, int]
    supervisor_threads: dict[str, int]  # the supervisor's threads by name (comm)
    rss_by_kind: dict[str, int] = field(default_factory=dict)  # bytes


@dataclass
class SoakResult:
    minutes: float
    produced: int = 0
    rows: int = 0
    exact: bool = False
    exit_code: int | None = None
    kills: int = 0
    broker_restarts: int = 0
    samples: list[Sample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def window(self, warm_up: float) -> tuple[list[Sample], list[Sample]]:
        """The first and last fifth of the samples after the warm-up."""
        if not self.samples:
            return [], []
        end = self.samples[-1].seconds
        kept = [s for s in self.samples if s.seconds >= end * warm_up]
        fifth = max(1, len(kept) // 5)
        return kept[:fifth], kept[-fifth:]

    def growth(self, warm_up: float) -> dict[str, float]:
        """Each metric's growth after the warm-up, as a fraction (0.05 is 5%)."""
        first, last = self.window(warm_up)
        out: dict[str, float] = {}
        if not first:
            return out
        for name in METRICS:
            before = statistics.median(getattr(s, name) for s in first)
            after = statistics.median(getattr(s, name) for s in last)
            floor = SEGMENT_BYTES if name == "handoff" else 1
            out[name] = (after - before) / max(before, floor)
        return out

    def line(self, warm_up: float) -> str:
        growth = self.growth(warm_up)
        first, last = self.window(warm_up)
        parts = [
            f"minutes={self.minutes:g}",
            f"produced={self.produced}",
            f"rows={self.rows}",
            f"exact={'true' if self.exact else 'false'}",
            f"exit={self.exit_code}",
            f"kills={self.kills}",
            f"broker_restarts={self.broker_restarts}",
        ]
        parts += [f"{name}_growth={growth.get(name, float('nan')) * 100:+.1f}%" for name in METRICS]
        if first and last:
            parts += [
                f"rss_mib={statistics.median(s.rss for s in last) / 2**20:.0f}",
                f"fds={statistics.median(s.fds for s in last):.0f}",
                f"threads={statistics.median(s.threads for s in last):.0f}",
                f"processes={statistics.median(s.processes for s in last):.0f}",
            ]
        return "RESULT " + " ".join(parts)


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def sample_tree(root: int, handoff: Path, started: float) -> Sample:
    rss = fds = threads = processes = 0
    by_kind: dict[str, int] = {}
    rss_by_kind: dict[str, int] = {}
    for info in process_tree(root):
        try:
            status = _status(info.pid)
            open_fds = len(os.listdir(f"/proc/{info.pid}/fd"))
        except OSError:  # exited between the listing and the read
            continue
        rss += int(status.get("VmRSS", "0 kB").split()[0]) * 1024
        count = int(status.get("Threads", "0"))
        threads += count
        fds += open_fds
        processes += 1
        kind = "supervisor" if info.pid == root else info.kind
        by_kind[kind] = by_kind.get(kind, 0) + count
        rss_by_kind[kind] = (
            rss_by_kind.get(kind, 0) + int(status.get("VmRSS", "0 kB").split()[0]) * 1024
        )
    size = 0
    for path in handoff.rglob("*"):
        try:
            if path.is_file():
                size += path.stat().st_size
        except OSError:  # published or released meanwhile
            continue
    return Sample(
        time.monotonic() - started,
        rss,
        fds,
        threads,
        size,
        processes,
        by_kind,
        _names(root),
        rss_by_kind,
    )


def _names(pid: int) -> dict[str, int]:
    names: dict[str, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return names


class SteadyProducer:
    """Sends ``rate`` records/s, round robin over the partitions, on a thread this object
    starts and joins. Each partition's delivered count is its log end (a fresh topic)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.sent = 0
        self.errors: list[str] = []
        self._producer: Any = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "enable.idempotence": True,
                "message.timeout.ms": 300_000,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._producer is None:
            return
        remaining = self._producer.flush(300)
        if remaining:
            self.errors.append(f"{remaining} records not delivered")
        self._producer = None  # its threads end here, before the broker stops

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _run(self) -> None:
        started = time.monotonic()
        pad = b"x" * VALUE_BYTES
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                value = b"%012d" % self.sent + pad[12:]
                try:
                    self._producer.produce(
                        self.topic,
                        value=value,
                        partition=self.sent % self.partitions,
                        on_delivery=self._on_delivery,
                    )
                except BufferError:
                    self._producer.poll(0.05)
                    continue
                self.sent += 1
            self._producer.poll(0)
            self._stop.wait(0.01)


def soak(
    *,
    minutes: float,
    rate: int,
    partitions: int = 4,
    kill_every: float = 60.0,
    sample_every: float = 5.0,
    broker_restart: bool = True,
    work: Path,
    log: Any = print,
) -> SoakResult:
    """One soak run (see the module docstring); nothing is asserted here."""
    result = SoakResult(minutes=minutes)
    topic = unique_name("soak")
    table = work / "table"
    handoff = work / "handoff"
    with KafkaCluster(1) as broker:
        create_topic(broker.bootstrap, topic, partitions=partitions)
        config = write_config(
            work / "ingest.toml",
            bootstrap=broker.bootstrap,
            topic=topic,
            group=unique_name("soak"),
            table=table,
            sections={
                "handoff": {
                    "mode": "files",
                    "root": str(handoff),
                    "segment_max_bytes": SEGMENT_BYTES,
                },
                "spark": {"engine": "local"},
                "kafka": {"retry_timeout": "120s"},
                "worker": {"retry_for": "300s"},
                "trigger": {"retry_for": "300s"},
            },
        )
        run = Cli(["run", "-c", str(config)], work / "run.log")
        started = time.monotonic()
        duration = minutes * 60
        next_kill = kill_every
        restart_at = duration / 2 if broker_restart else float("inf")
        try:
            with SteadyProducer(broker.bootstrap, topic, partitions, rate) as producer:
                next_sample = 0.0
                while (now := time.monotonic() - started) < duration:
                    if run.process.poll() is not None:
                        result.problems.append(f"the run exited early ({run.process.returncode})")
                        break
                    if now >= next_sample:
                        result.samples.append(sample_tree(run.process.pid, handoff, started))
                        next_sample += sample_every
                    if now >= next_kill:
                        workers = [p for p in process_tree(run.process.pid) if p.kind == "worker"]
                        if workers:
                            victim = workers[result.kills % len(workers)]
                            os.kill(victim.pid, signal.SIGKILL)
                            result.kills += 1
                        next_kill += kill_every
                    if now >= restart_at:
                        log(f"{now:.0f}s: restarting the broker")
                        broker.restart()
                        result.broker_restarts += 1
                        restart_at = float("inf")
                    time.sleep(0.2)
                producer.stop()
                result.produced = producer.sent
                result.problems += producer.errors[:3]
            log(f"{time.monotonic() - started:.0f}s: produced {result.produced}; waiting")
            ends = [len(range(p, result.produced, partitions)) for p in range(partitions)]

            def landed() -> bool:
                try:
                    return bool(table_offsets(table).num_rows >= result.produced)
                except Exception:
                    return False

            try:
                wait_until(landed, 300, "every record in the table")
            except AssertionError as exc:
                result.problems.append(str(exc))
            run.signal(signal.SIGTERM)
            result.exit_code = run.wait(120)
        finally:
            run.kill()
    rows = table_offsets(table)
    result.rows = rows.num_rows
    parts = rows.column("partition").to_numpy()
    offsets = rows.column("offset").to_numpy()
    result.exact = result.rows == result.produced and all(
        np.array_equal(offsets[parts == p], np.arange(end)) for p, end in enumerate(ends)
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=5_000, help="records/s (default 5000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--warm-up", type=float, default=0.2, help="fraction left out (0.2)")
    parser.add_argument("--no-broker-restart", action="store_true")
    parser.add_argument("--work", type=Path, default=None, help="keep the run directory here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="ingest-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory: {work}; load average {os.getloadavg()}", flush=True)
    result = soak(
        minutes=args.minutes,
        rate=args.rate,
        partitions=args.partitions,
        kill_every=args.kill_every,
        sample_every=args.sample_every,
        broker_restart=not args.no_broker_restart,
        work=work,
        log=lambda text: print(text, flush=True),
    )
    first, last = result.window(args.warm_up)
    if first and last:
        kinds = sorted({k for s in first + last for k in s.threads_by_kind})
        for kind in kinds:
            before = statistics.median(s.threads_by_kind.get(kind, 0) for s in first)
            after = statistics.median(s.threads_by_kind.get(kind, 0) for s in last)
            print(f"threads of {kind}: {before:g} -> {after:g}")
        for kind in sorted({k for s in first + last for k in s.rss_by_kind}):
            before = statistics.median(s.rss_by_kind.get(kind, 0) for s in first) / 2**20
            after = statistics.median(s.rss_by_kind.get(kind, 0) for s in last) / 2**20
            print(f"rss of {kind}: {before:.0f} -> {after:.0f} MiB")
        before = statistics.median(s.handoff for s in first) / 2**20
        after = statistics.median(s.handoff for s in last) / 2**20
        print(f"handoff: {before:.1f} -> {after:.1f} MiB")
        names = sorted({n for s in (first[0], last[-1]) for n in s.supervisor_threads})
        for name in names:
            before_n = first[0].supervisor_threads.get(name, 0)
            after_n = last[-1].supervisor_threads.get(name, 0)
            if before_n != after_n:
                print(f"supervisor threads named {name!r}: {before_n} -> {after_n}")
    with open(work / "samples.jsonl", "w") as out:
        for sample in result.samples:
            out.write(json.dumps(dataclasses.asdict(sample)) + "\n")
    print(f"samples: {work / 'samples.jsonl'}")
    for problem in result.problems:
        print(f"problem: {problem}")
    print(result.line(args.warm_up), flush=True)
    growth = result.growth(args.warm_up)
    flat = bool(growth) and all(value <= 0.05 for value in growth.values())
    return 0 if result.exact and result.exit_code == 0 and flat and not result.problems else 1


if __name__ == "__main__":
    sys.exit(main())
