"""Scale benchmark: two supervisor hosts with a Spark worker each against one host on
``local[2]`` (issue 19, item 4).

Network-namespace hosts on this machine (``ingest.testing.netns``, root): ``kafka`` (one
Apache Kafka node), ``client`` (the producer and the checks), ``sup-a``, ``sup-b`` and
``spark-master``. One topic, ``--partitions`` x ``--records`` JSON values of 100 B
(e2e.py's producer), produced once; then, on the same topic, each with its own group and
table, in one run:

* (A) one host: ``ingest run --until-end`` on ``sup-a``, ``spark.master = "local[2]"``,
  ``spark.engine = "spark"`` (Spark's executors in the supervisor's JVM);
* (B) two hosts: ``ingest run --until-end`` on ``sup-a`` and on ``sup-b`` at once, one
  group, ``spark.master`` a standalone master on ``spark-master`` with a worker (1 core,
  ``--worker-memory``) on each supervisor host (``SparkCluster(hosts=..., master_host=...)``,
  started before the runs, as a standing cluster is; its start time is printed apart);
  each supervisor's application capped at one core (``spark.cores.max``), so the two
  applications hold the two workers' cores, as local[2] holds two.

Both use the handoff in files mode on one directory (what a shared mount is to several
hosts), or with ``--store s3`` the handoff and the tables on SeaweedFS on host ``s3``; the
product's other defaults, JSON logs. Per run: wall seconds (process start to
the last exit), rows/s, CPU seconds of every process (the supervisors' trees; in (B) also
the Spark workers, their executors and the master; the broker and S3 server apart), CPU by kind, and
where the time went from each supervisor's ``batch_committed`` events (``stages``: plan,
spark, dead_letters, commit) and its workers' fetch span. Every table is checked exact
(each (partition, offset) once, with the value produced there, no dead letters) and the
group's committed offsets at the ends.

On one machine the hosts share its cores: (B) cannot be faster than the cores allow, so
its ratio shows what distribution costs, not what more machines give; the projection at
the end is arithmetic on (A)'s and (B)'s per-stage costs (docs/benchmarks.md).

    flock /tmp/ingest-bench.lock .venv/bin/python scripts/bench/scale.py      # 32 x 200k
    .venv/bin/python scripts/bench/scale.py --partitions 8 --records 20000    # a quick one
    .venv/bin/python scripts/bench/scale.py --batch-bytes 64MiB   # many batches: commits race
    .venv/bin/python scripts/bench/scale.py --store s3            # handoff and tables on S3

The last line is ``RESULT two_hosts_vs_one=<B rows/s over A's> a_rows_per_s=.. b_rows_per_s=..
cpu_b_vs_a=.. exact=<true|false>``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import (
    ROOT,
    RunPhases,
    TreeSampler,
    check_exact,
    dead_letter_rows,
    gib,
    load_average,
    log_events,
    machine,
    produce_json,
    run_phases,
    write_config,
)

from ingest.testing import KafkaCluster, S3Server, SparkCluster, create_topic, unique_name
from ingest.testing.apache_kafka import wait_for_leaders
from ingest.testing.netns import Host, HostNetwork, unavailable

HOSTS = ("kafka", "client", "sup-a", "sup-b", "spark-master", "s3")
SUPERVISORS = ("sup-a", "sup-b")
RUN_TIMEOUT = 3600.0


@dataclass
class HostRun:
    """One ``ingest run --until-end`` in a host, its process tree sampled."""

    host: Host
    log: Path
    process: subprocess.Popen[bytes]
    sampler: TreeSampler
    began: float
    seconds: float | None = None

    @classmethod
    def start(cls, host: Host, config: Path, log: Path) -> HostRun:
        argv = [sys.executable, "-m", "ingest.cli", "run", "-c", str(config), "--until-end"]
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(ROOT),
            # The driver binds to and advertises its host's address (executors call it).
            SPARK_LOCAL_IP=host.address,
        )
        with open(log, "w") as out:
            process = subprocess.Popen(
                host.argv(argv), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        sampler = TreeSampler(process.pid).__enter__()
        return cls(host, log, process, sampler, time.perf_counter())

    def wait(self, deadline: float) -> int:
        try:
            code = self.process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"ingest on {self.host.name} ran over; log {self.log}") from None
        self.seconds = time.perf_counter() - self.began
        self.sampler.__exit__()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        self.sampler.__exit__()


@dataclass
class Outcome:
    """One configuration's figures."""

    label: str
    seconds: float
    rows: int
    cpu: float
    cpu_by_kind: dict[str, float]
    peak_rss: int
    hosts: dict[str, RunPhases]
    landed: dict[str, int]
    problem: str | None
    broker_cpu: float
    extra: dict[str, float] = field(default_factory=dict)
    warm_up: dict[str, float | None] = field(default_factory=dict)
    races: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def committed_at_ends(bootstrap: str, group: str, topic: str, ends: Mapping[int, int]) -> str:
    """None-like "" when the group's committed offsets are the partitions' ends."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=30)
    finally:
        consumer.close()
    behind = [f"{tp.partition}@{tp.offset}" for tp in committed if tp.offset != ends[tp.partition]]
    return f"committed offsets short of the end: {behind[:4]}" if behind else ""


def landed_rows(log: Path) -> int:
    return sum(int(e["rows"]) for e in log_events(log) if e.get("event") == "batch_committed")


def interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through main's teardown


def run_config(
    label: str,
    network: HostNetwork,
    names: Sequence[str],
    work: Path,
    *,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    per: int,
    sections: Mapping[str, Mapping[str, Any]],
    store: str,
    storage_options: Mapping[str, str],
    also_sampled: Sequence[int] = (),
    apart_pids: Sequence[int] = (),
) -> Outcome:
    """``ingest run --until-end`` on each host of ``names`` at once, one group and table."""
    here = work / label
    here.mkdir()
    group = unique_name(f"scale-{label}")
    table = f"{store}/{label}/table" if store.startswith("s3://") else str(here / "table")
    config = write_config(
        here / "run.toml", bootstrap=bootstrap, topic=topic, group=group, table=Path(table),
        sections={**sections, "table": {"uri": table, "storage_options": dict(storage_options)}},
    )  # fmt: skip
    others = [TreeSampler(pid, pss=False).__enter__() for pid in also_sampled]
    apart = [TreeSampler(pid, pss=False).__enter__() for pid in apart_pids]
    runs: list[HostRun] = []
    began = time.perf_counter()
    try:
        for name in names:
            runs.append(HostRun.start(network[name], config, here / f"{name}.log"))
        deadline = time.monotonic() + RUN_TIMEOUT
        codes = [run.wait(deadline) for run in runs]
        seconds = time.perf_counter() - began
    finally:
        for run in runs:
            run.kill()
        for sampler in [*others, *apart]:
            sampler.__exit__()
    for run, code in zip(runs, codes, strict=True):
        if code != 0:
            raise RuntimeError(f"{label}: ingest on {run.host.name} exited {code}; log {run.log}")
    # From the client host: an S3 server in a host is reached there.
    client = network["client"]
    problem = client.call(check_exact, table, ends, per, storage_options)
    dead = client.call(dead_letter_rows, f"{table}_dead_letters", storage_options)
    if problem is None and dead:
        problem = f"{dead} dead letters"
    if problem is None:
        problem = client.call(committed_at_ends, bootstrap, group, topic, ends) or None
    kinds: dict[str, float] = {}
    for sampler in [*(r.sampler for r in runs), *others]:
        for kind, spent in sampler.cpu_by_kind().items():
            key = "spark cluster jvm" if sampler in others and kind == "spark jvm" else kind
            kinds[key] = kinds.get(key, 0.0) + spent
    return Outcome(
        label,
        seconds,
        sum(ends.values()),
        sum(kinds.values()),
        dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        sum(r.sampler.peak_rss for r in runs),
        {r.host.name: run_phases(r.log) for r in runs},
        {r.host.name: landed_rows(r.log) for r in runs},
        problem,
        sum(sampler.cpu_seconds for sampler in apart),
        {f"{r.host.name} s": r.seconds or 0.0 for r in runs},
        {r.host.name: warm_up_seconds(r.log) for r in runs},
        {r.host.name: lost_races(r.log) for r in runs},
    )


def spark_cluster_pids(cluster: SparkCluster) -> list[int]:
    return [p.pid for p in [cluster.master, *cluster.workers] if p.pid is not None]


# -- report ----------------------------------------------------------------------------------


def warm_up_seconds(log: Path) -> float | None:
    """The session's warm-up job (``spark warm-up job took Xs``): on a cluster, mostly
    the executor's start (its JVM, its Python daemon) before the first batch can run."""
    for entry in log_events(log):
        found = re.match(r"spark warm-up job took ([\d.]+)s", str(entry.get("msg", "")))
        if found:
            return float(found.group(1))
    return None


def lost_races(log: Path) -> int:
    """Delta commits that lost to another writer's and were tried again (``lost a race``):
    the serial part, two hosts committing to one table."""
    return sum("lost a race" in str(e.get("msg", "")) for e in log_events(log))


def describe(outcome: Outcome) -> None:
    print(
        f"\n## {outcome.label}: {outcome.seconds:.1f} s, {outcome.rate:,.0f} rows/s, "
        f"CPU {outcome.cpu:.1f} s ({outcome.cpu / outcome.rows * 1e6:.2f} us/row; broker "
        f"and S3 server {outcome.broker_cpu:.1f} s apart), peak RSS of the supervisors' trees "
        f"{gib(outcome.peak_rss):.2f} GiB, exact: {outcome.problem or 'yes'}"
    )
    print("   CPU s by kind: " + ", ".join(f"{k} {v:.1f}" for k, v in outcome.cpu_by_kind.items()))
    for host, phases in outcome.hosts.items():
        warm = outcome.warm_up.get(host)
        print(
            f"   {host}: ran {outcome.extra.get(f'{host} s', 0):.1f} s, landed "
            f"{outcome.landed[host]:,} rows; commits that lost a race "
            f"{outcome.races.get(host, 0)}; warm-up job "
            f"{'?' if warm is None else f'{warm:.1f}s'}; {phases.describe()}"
        )


@dataclass(frozen=True)
class Costs:
    """Per-stage costs of one configuration, from its logs and samples."""

    start: float  # seconds from a supervisor's first log line to its first batch (the slowest)
    task_core_us: float  # Spark stage seconds x the cores the tasks had, per row
    fetch_cpu_us: float  # the ingest workers' CPU (fetch, decode of record batches), per row
    supervisor_cpu_us: float
    commit_each: float  # seconds per Delta commit
    rows_per_batch: float

    @classmethod
    def of(cls, outcome: Outcome, cores_per_app: int) -> Costs:
        phases = list(outcome.hosts.values())
        batches = sum(p.batches for p in phases) or 1
        spark = sum(p.stages.get("spark", 0.0) for p in phases)
        kinds = outcome.cpu_by_kind
        return cls(
            max(p.first_batch_at or 0.0 for p in phases),
            spark * cores_per_app / outcome.rows * 1e6,
            kinds.get("ingest workers", 0.0) / outcome.rows * 1e6,
            kinds.get("supervisor", 0.0) / outcome.rows * 1e6,
            sum(p.stages.get("commit", 0.0) for p in phases) / batches,
            outcome.rows / batches,
        )

    def line(self) -> str:
        return (
            f"start to first batch {self.start:.1f} s; Spark tasks {self.task_core_us:.2f} "
            f"core-us/row; fetch {self.fetch_cpu_us:.2f} CPU-us/row; supervisor "
            f"{self.supervisor_cpu_us:.2f} CPU-us/row; Delta commit {self.commit_each:.3f} s "
            f"per batch of {self.rows_per_batch:,.0f} rows"
        )


def projection(a: Outcome, b: Outcome) -> list[str]:
    """Arithmetic on the measured per-stage costs, not a measurement: a backlog of the
    run's rows on N hosts of 2 cores each, their own. Per host in parallel: the fetch
    (the workers), the supervisor, the Spark tasks on its executor; serial on the table:
    one Delta commit at a time. T(N) = start + rows x (tasks + fetch + supervisor) /
    (N x 2 cores) + commits; the steady rate (start paid once) is the middle term's."""
    costs = {"A": Costs.of(a, 2), "B": Costs.of(b, 1)}
    lines = [f"({name}) {c.line()}" for name, c in costs.items()]
    rows = b.rows
    for name, c in costs.items():
        per_row = (c.task_core_us + c.fetch_cpu_us + c.supervisor_cpu_us) / 1e6
        commit_bound = c.rows_per_batch / c.commit_each if c.commit_each else float("inf")
        parts = []
        for hosts in (1, 2, 4, 8):
            steady = min(hosts * 2 / per_row, commit_bound)
            batches = max(hosts, rows / c.rows_per_batch)
            backlog = rows / (costs["B"].start + rows / steady + batches * c.commit_each)
            parts.append(f"{hosts}: {steady:,.0f} ({backlog:,.0f})")
        lines.append(
            f"projected from ({name})'s costs, hosts: steady rows/s (this backlog, with B's "
            f"start): " + ", ".join(parts) + f"; the commits alone allow {commit_bound:,.0f}"
        )
    return lines


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--records", type=int, default=200_000, help="per partition")
    parser.add_argument("--worker-memory", default="2g", help="each Spark worker's memory")
    parser.add_argument("--only", default="a,b", help="a, b, a,b (default) or b,a: in that order")
    parser.add_argument(
        "--store",
        choices=["files", "s3"],
        default="files",
        help="the handoff and the tables: a directory (default) or SeaweedFS on host s3",
    )
    parser.add_argument(
        "--batch-bytes", help="trigger.max_bytes in both (default: the product's, 1GiB)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        sys.exit(f"scale.py needs network namespaces: {reason}")
    order = [part for part in args.only.split(",") if part in ("a", "b")]
    per, partitions = args.records, args.partitions
    ends = dict.fromkeys(range(partitions), per)
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-scale-"))
    print(f"# {machine()}; load average before: {load_average()}; work dir {work}")
    outcomes: dict[str, Outcome] = {}
    network = HostNetwork(HOSTS, call_timeout=RUN_TIMEOUT)
    kafka: KafkaCluster | None = None
    spark: SparkCluster | None = None
    s3: S3Server | None = None
    # SIGTERM (a killed bench) unwinds through the finally below like Ctrl-C.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        network.start()
        kafka = KafkaCluster(1, hosts=[network["kafka"]]).start()
        bootstrap = kafka.bootstrap
        client = network["client"]
        topic = unique_name("bench-scale")
        client.call(create_topic, bootstrap, topic, partitions=partitions)
        client.call(wait_for_leaders, bootstrap, topic)
        produced = client.call(produce_json, bootstrap, topic, partitions, per, idempotent=True)
        print(f"# {partitions} x {per:,} records of 100 B produced in {produced:.1f} s")
        store, options = str(work), {}
        if args.store == "s3":
            s3 = S3Server(on=network["s3"]).start()
            store, options = f"s3://{s3.bucket}/scale", s3.storage_options()
        handoff = f"{store}/handoff"
        base: dict[str, dict[str, Any]] = {"handoff": {"mode": "files", "root": handoff}}
        if args.batch_bytes:
            base["trigger"] = {"max_bytes": args.batch_bytes}
        common = {
            **{"bootstrap": bootstrap, "topic": topic, "ends": ends, "per": per},
            **{"store": store, "storage_options": options},
        }
        apart_pids = [pid for pid in (kafka.pid, s3.pid if s3 else None) if pid is not None]
        for which in order:
            print(f"# load average before ({which.upper()}): {load_average()}", flush=True)
            if which == "a":
                sections = {**base, "spark": {"master": "local[2]", "engine": "spark"}}
                outcomes["A"] = run_config(
                    "A-one-host", network, ["sup-a"], work, sections=sections,
                    apart_pids=apart_pids, **common,
                )  # fmt: skip
            else:
                began = time.perf_counter()
                spark = SparkCluster(
                    hosts=[network[name] for name in SUPERVISORS],
                    master_host=network["spark-master"],
                    memory=args.worker_memory,
                    work_dir=work / "spark",
                ).start()
                print(f"# Spark master + 2 workers ready in {time.perf_counter() - began:.1f} s")
                conf = {"spark.cores.max": "1", "spark.executor.memory": args.worker_memory}
                sections = {**base, "spark": {"master": spark.master_url, "conf": conf}}
                outcomes["B"] = run_config(
                    "B-two-hosts", network, list(SUPERVISORS), work, sections=sections,
                    also_sampled=spark_cluster_pids(spark), apart_pids=apart_pids, **common,
                )  # fmt: skip
                spark.cleanup()
                spark = None
            describe(outcomes[which.upper()])
    finally:
        for server in (spark, kafka, s3):
            if server is not None:
                try:
                    server.cleanup()
                except Exception as exc:  # the rest is still torn down
                    print(f"# teardown: {exc}")
        network.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n# load average after: {load_average()}")
    exact = all(o.problem is None for o in outcomes.values())
    parts = []
    if "A" in outcomes and "B" in outcomes:
        a, b = outcomes["A"], outcomes["B"]
        for line in projection(a, b):
            print(f"# {line}")
        parts += [f"two_hosts_vs_one={b.rate / a.rate:.2f}", f"cpu_b_vs_a={b.cpu / a.cpu:.2f}"]
    parts += [f"{k.lower()}_rows_per_s={o.rate:.0f}" for k, o in outcomes.items()]
    print("RESULT " + " ".join([*parts, f"exact={str(exact).lower()}"]))


if __name__ == "__main__":
    main()
