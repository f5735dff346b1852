"""Latency benchmark: continuous ``ingest run``, produce-to-visible time in Delta.

One Tansu broker, a topic of ``--partitions`` partitions. For each trigger interval
(``trigger.max_age``, default 1 s and 10 s) the real CLI runs continuously (no
``--until-end``) into a fresh table with:

* ``fetch.max_wait = 100ms``: Tansu's long poll is not woken by new data, so a
  record waits about max_wait/2 for its Fetch (docs/kafka-compat.md);
* ``handoff.segment_max_age = 250ms``: a segment is sealed (and so can be batched)
  at most 250 ms after its first record.

First a warm-up record per partition is produced and awaited in the table, so
Spark's start and its first batch are done ("a warm Spark session"). Then a
producer in this process sends ``--rate`` records/s for ``--seconds``, each value
carrying its produce time in ms (``ts``). This process polls the table every 50 ms
(delta-rs ``update_incremental``) and reads each new data file's ``id`` and ``ts``:
latency = the poll time at which the row is first visible - ``ts`` (so it includes
up to 50 ms of polling). Every produced id must show up exactly once. The run is
then stopped with SIGTERM (a graceful stop must exit 0).

    .venv/bin/python scripts/bench/latency.py [--rate 5000] [--seconds 30] [--triggers 1,10]

``--pipelines ours,ss`` also runs Structured Streaming (``_structured.continuous``: the Kafka
source, ``from_json``, delta-spark's sink, ``Trigger.ProcessingTime`` at the same interval, in
a process of its own) on a topic of its own, watched the same way; SIGTERM stops its query.
e2e.py ``--continuous`` runs both on Apache Kafka at 100k records/s for 3 minutes a trigger.

Target (issue 38): ingest's p99 <= trigger interval + 1 s, and below Structured Streaming's
at the same trigger when it ran. The last line is ``RESULT p99_1s=<s> p99_10s=<s>
[ss_p99_1s=<s> ss_p99_10s=<s>] met=<true|false> exact=<true|false>``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import (
    ROOT,
    VALUE_DDL,
    TreeSampler,
    gib,
    ingest_argv,
    json_value,
    load_average,
    machine,
    run_phases,
    write_config,
)

from ingest.testing import TansuBroker, create_topic, unique_name

POLL = 0.05
WARM_ID_BASE = 90_000_000  # warm-up records' ids, apart from the measured ones


class TableWatcher:
    """Polls a Delta table; remembers when each row's id was first visible."""

    def __init__(self, uri: Path) -> None:
        self.uri = str(uri)
        self.table: Any = None
        self.files: set[str] = set()
        self.seen: dict[int, tuple[float, int]] = {}  # id -> (visible at, ts ms)
        self.duplicates = 0

    def poll(self) -> None:
        from deltalake import DeltaTable

        if self.table is None:
            if not DeltaTable.is_deltatable(self.uri):
                return
            self.table = DeltaTable(self.uri)
        else:
            self.table.update_incremental()
        fresh = [uri for uri in self.table.file_uris() if uri not in self.files]
        if not fresh:
            return
        now_ms = time.time() * 1000
        for uri in fresh:
            self.files.add(uri)
            rows = pq.read_table(uri, columns=["id", "ts"])
            for record_id, ts in zip(
                rows.column("id").to_pylist(), rows.column("ts").to_pylist(), strict=True
            ):
                if record_id in self.seen:
                    self.duplicates += 1
                else:
                    self.seen[record_id] = (now_ms, ts)

    def wait_for(self, ids: set[int], timeout: float, process: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"ingest exited {process.returncode} early")
            self.poll()
            if ids <= self.seen.keys():
                return True
            time.sleep(POLL)
        return False


def produce_at_rate(
    bootstrap: str, topic: str, partitions: int, rate: int, seconds: float, first_id: int
) -> list[int]:
    """Sends ``rate`` records/s round-robin over partitions; returns the ids sent."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": False,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    ids: list[int] = []
    tick = 0.01
    began = time.monotonic()
    next_id = first_id
    while time.monotonic() - began < seconds:
        due = int((time.monotonic() - began) * rate) - len(ids)
        for _ in range(max(0, due)):
            now_ms = time.time_ns() // 1_000_000
            while True:
                try:
                    producer.produce(
                        topic,
                        json_value(next_id, now_ms),
                        partition=next_id % partitions,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:  # librdkafka's queue is full: let it send, then again
                    producer.poll(0.005)
            ids.append(next_id)
            next_id += 1
        producer.poll(0)
        time.sleep(tick)
    if producer.flush(30) or errors:
        raise RuntimeError(f"produce failed: {errors[:3]}")
    return ids


def pipeline_argv(
    pipeline: str, workdir: Path, name: str, bootstrap: str, topic: str, trigger: float
) -> list[str]:
    """The continuous run of ``pipeline`` ("ours": the ingest CLI; "ss": Structured
    Streaming, ``_structured.continuous``) into ``workdir/name``."""
    table = workdir / name
    if pipeline == "ss":
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            *("--ss-peer", "--bootstrap", bootstrap, "--topic", topic),
            *("--table", str(table), "--trigger", f"{trigger:g}"),
        ]
    config = write_config(
        workdir / f"{name}.toml",
        bootstrap=bootstrap,
        topic=topic,
        group=unique_name(name),
        table=table,
        sections={
            "fetch": {"max_wait": "100ms"},
            "handoff": {"segment_max_age": "250ms"},
            "trigger": {"max_age": f"{trigger:g}s"},
        },
    )
    return ingest_argv(config)


def run_trigger(
    workdir: Path,
    bootstrap: str,
    partitions: int,
    trigger: float,
    rate: int,
    seconds: float,
    pipeline: str = "ours",
) -> dict[str, Any]:
    """One continuous run of ``pipeline`` at ``trigger`` seconds: ``rate`` records/s for
    ``seconds`` after a warm-up, each row's produce-to-visible latency."""
    name = f"{pipeline}-trigger{trigger:g}s"
    topic = unique_name(f"bench-latency-{name}")
    create_topic(bootstrap, topic, partitions=partitions)
    table = workdir / name
    argv = pipeline_argv(pipeline, workdir, name, bootstrap, topic, trigger)
    log = workdir / f"{name}.log"
    watcher = TableWatcher(table)
    with open(log, "w") as out:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            with TreeSampler(process.pid, interval=0.5, pss=False) as sampler:
                warm = {WARM_ID_BASE + p for p in range(partitions)}
                _produce_ids(bootstrap, topic, partitions, sorted(warm))
                began = time.monotonic()
                if not watcher.wait_for(warm, 300, process):
                    raise RuntimeError(f"warm-up records not visible after 300 s; log: {log}")
                print(f"# {name}: warm after {time.monotonic() - began:.1f}s", flush=True)
                ids: list[int] = []
                failed: list[BaseException] = []

                def produce() -> None:
                    try:
                        ids.extend(produce_at_rate(bootstrap, topic, partitions, rate, seconds, 0))
                    except BaseException as exc:
                        failed.append(exc)

                producer = threading.Thread(target=produce, name="producer")
                producer.start()
                # Polls while producing, so a row's first sighting is when it became visible.
                while producer.is_alive():
                    watcher.poll()
                    time.sleep(POLL)
                producer.join()
                if failed:
                    raise RuntimeError(f"the producer failed: {failed[0]!r}") from failed[0]
                # A pipeline that fell behind gets as long again to catch up: its late
                # rows' latencies are the figure, not a loss.
                complete = watcher.wait_for(set(ids), trigger + max(60, seconds), process)
            process.send_signal(signal.SIGTERM)
            code = process.wait(120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    measured_ids = set(ids)
    latencies = np.array(
        [seen - ts for i, (seen, ts) in watcher.seen.items() if i in measured_ids], float
    )
    missing = len(measured_ids - watcher.seen.keys())
    stray = len(watcher.seen.keys() - measured_ids - warm)
    problem = None
    if missing or watcher.duplicates or stray or not complete:
        problem = f"missing {missing}, duplicates {watcher.duplicates}, unexpected {stray}"
    if code != 0:
        problem = (problem or "") + f" (SIGTERM exit {code})"
    phases = run_phases(log)
    return {
        "pipeline": pipeline,
        "trigger": trigger,
        "records": len(ids),
        "p50": float(np.percentile(latencies, 50)) / 1000 if len(latencies) else float("nan"),
        "p99": float(np.percentile(latencies, 99)) / 1000 if len(latencies) else float("nan"),
        "max": float(latencies.max()) / 1000 if len(latencies) else float("nan"),
        "batches": phases.batches,
        "batch_seconds": phases.batch_seconds,
        "rss": sampler.peak_rss,
        "cpu": sampler.cpu_seconds,
        "problem": problem,
    }


def _produce_ids(bootstrap: str, topic: str, partitions: int, ids: list[int]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False})
    for record_id in ids:
        now_ms = time.time_ns() // 1_000_000
        producer.produce(topic, json_value(record_id, now_ms), partition=record_id % partitions)
    if producer.flush(30):
        raise RuntimeError("warm-up records not delivered")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000, help="records/s")
    parser.add_argument("--seconds", type=float, default=30, help="of producing, a trigger")
    parser.add_argument("--triggers", default="1,10", help="trigger.max_age values, seconds")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--pipelines",
        default="ours",
        help="ours and/or ss (Structured Streaming, processing-time trigger), comma-separated",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--ss-peer", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--bootstrap", "--topic", "--table", "--trigger"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ss_peer:
        import _structured

        table = Path(args.table)
        checkpoint = table.with_name(table.name + "_checkpoint")
        _structured.continuous(
            args.bootstrap, args.topic, table, checkpoint, VALUE_DDL, float(args.trigger)
        )
        return

    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-latency-"))
    print(f"# {machine()}; load average before: {load_average()}")
    print(
        f"# {args.rate} records/s for {args.seconds:g}s a trigger, {args.partitions} partitions; "
        f"work dir {workdir}"
    )
    results = []
    try:
        with TansuBroker() as broker:
            for pipeline in args.pipelines.split(","):
                for trigger in (float(t) for t in args.triggers.split(",")):
                    results.append(
                        run_trigger(
                            workdir,
                            broker.bootstrap,
                            args.partitions,
                            trigger,
                            args.rate,
                            args.seconds,
                            pipeline,
                        )
                    )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"# load average after: {load_average()}")
    print(f"RESULT {print_latencies(results)}")


TARGET_OVER_TRIGGER = 1.0  # issue 38: ingest's p99 at most the trigger + 1 s


def print_latencies(results: list[dict[str, Any]]) -> str:
    """Prints the table of ``run_trigger`` results; returns their RESULT figures:
    ``p99_<t>s`` (ours), ``ss_p99_<t>s``, ``met`` (ours within the target, and below
    Structured Streaming's p99 at the same trigger when it ran) and ``exact``."""
    print()
    print(
        f"{'pipeline':9} {'trigger':>8} {'records':>8} {'p50 s':>7} {'p99 s':>7} {'max s':>7} "
        f"{'target':>7} {'met':>4} {'batches':>8} {'CPU s':>7} {'RSS GiB':>8} exact"
    )
    met = True
    ss_p99 = {r["trigger"]: r["p99"] for r in results if r["pipeline"] == "ss"}
    for r in results:
        ours = r["pipeline"] == "ours"
        target = r["trigger"] + TARGET_OVER_TRIGGER
        ok = r["p99"] <= target and r["p99"] < ss_p99.get(r["trigger"], float("inf"))
        if ours:
            met = met and ok
        print(
            f"{r['pipeline']:9} {r['trigger']:7g}s {r['records']:8} {r['p50']:7.2f} "
            f"{r['p99']:7.2f} {r['max']:7.2f} "
            + (f"{target:6g}s {'yes' if ok else 'no':>4} " if ours else f"{'':7} {'':4} ")
            + f"{r['batches']:8} {r['cpu']:7.1f} {gib(r['rss']):8.2f} {r['problem'] or 'yes'}"
        )
    exact = all(r["problem"] is None for r in results)
    figures = [
        f"{'' if r['pipeline'] == 'ours' else 'ss_'}p99_{r['trigger']:g}s={r['p99']:.2f}"
        for r in results
    ]
    return " ".join([*figures, f"met={str(met).lower()}", f"exact={str(exact).lower()}"])


if __name__ == "__main__":
    main()
