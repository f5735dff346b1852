"""End-to-end benchmark: a topic into a Delta table, ingest against the pipelines users know.

One Apache Kafka node (KRaft, from Maven Central; ``--broker tansu`` for the quickstart's
broker). For each size, JSON records produced once to 8 partitions, then, in turn, on the
same topic, each pipeline with its own group and table (the broker's group coordinator is
warmed up first, untimed: a fresh broker creates ``__consumer_offsets`` at the first
group's lookup, which a user's cluster has long done; and each topic is read once, untimed,
after it is produced, so that no pipeline is a fresh topic's first reader):

* (a) ingest: ``ingest run --until-end`` (the CLI as a subprocess, JSON value schema
  declared in the config, product defaults: no transform on local[2], so the local engine,
  no JVM), on Apache Kafka with the consumer group protocol (KIP-848: no initial rebalance
  delay), wall clock from process start to exit; (a') the same with the classic protocol
  (``--only`` it: ``classic``), which waits out the broker's
  ``group.initial.rebalance.delay.ms`` (3 s, Kafka's default, kept here as users run it);
* (b) naive: a confluent-kafka group consumer, orjson per value, a pyarrow table per 100k
  messages, ``write_deltalake`` append, a synchronous offset commit after each write;
* (c) limit: librdkafka's raw consumer reading every message (nothing built), plus one
  delta-rs write of the same rows as Arrow: read + write seconds (not a pipeline: a floor
  for one way of reading);
* (d) Spark Structured Streaming: ``spark-sql-kafka-0-10`` for the installed Spark,
  ``from_json`` with the same schema, delta-spark's sink, ``Trigger.AvailableNow``, in the
  same local[2] Spark with Delta's jars (``_structured.py``), wall clock like (a);
* (e) kafka-delta-ingest, when ``--kdi-binary PATH`` is given: ``-e``, JSON, its own
  ``kafka.partition``/``kafka.offset`` transforms (``_kdi.py``), seconds from its start to
  the commit that completed its table (``-e`` ends only on a record produced after it
  started, so the harness produces one with no value to each partition then; ``_kdi.py``
  says why).

Sizes (``--sizes``): 100k, 500k and 5M records of 100 B, and 1M of 1 KB (``1M@1KB``).
``--upsert`` adds the second workload: 5M change events over 500k keys (``--upsert-size``)
into a table keyed by ``id``, through (a) ingest's upsert mode and (d) Structured Streaming
with ``foreachBatch`` + Delta MERGE (latest offset wins in both); kafka-delta-ingest cannot
upsert.

``--compile`` compiles the checkout's modules to bytecode first, as ``pip install`` does
(with PYTHONDONTWRITEBYTECODE set, as in this workplace, every process start compiles them
otherwise; the header says which). ``(c')`` beside the limit: the same run of it timed as a
process, as (a) is (its wall clock, less the untimed Arrow building between its phases);
``small_vs_limit_process`` is that figure's ratio at 100k.

Every table is checked exact: every (partition, offset) once, nothing else, each row's
``id`` the one produced at its offset (upsert: one row per key, its last change). Peak
memory is the whole process tree's (sum of VmRSS; Pss too), sampled from /proc every
0.25 s; CPU is the tree's user + system seconds. "lag visible" says whether the group's
committed offsets reach the end, as ``kafka-consumer-groups --describe`` would show them.

    .venv/bin/python scripts/bench/e2e.py                      # every size, ~15 min
    .venv/bin/python scripts/bench/e2e.py --sizes 100k,500k    # the small triggers
    .venv/bin/python scripts/bench/e2e.py --kdi-binary ~/kdi/target/release/kafka-delta-ingest
    .venv/bin/python scripts/bench/e2e.py --sizes 100k --upsert --upsert-size 1M

The last line is ``RESULT vs_ss=.. vs_kdi=.. vs_naive=.. vs_limit=.. small_vs_naive=..
small_vs_limit=.. exact=.. peak_rss_gib=..``: rows/s ratios, ours over theirs, at the
largest 100-byte size (small_vs_naive at 500k, small_vs_limit at 100k: wall time ratio
limit over ours, so above 0.5 means within 2x); peak_rss_gib is ours at the largest size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _changes import check_latest, produce_changes
from _kdi import run_kdi
from _peers import limit_pipeline, naive_pipeline
from _pipeline import (
    OUTPUT_SCHEMA,
    ROOT,
    VALUE_DDL,
    VALUE_SCHEMA,
    Measured,
    check_exact,
    gib,
    ingest_until_end,
    load_average,
    machine,
    produce_json,
    run_measured,
    warm_group_coordinator,
    warm_topic,
)

from ingest.formats.decode import DecodeSpec
from ingest.testing import KafkaCluster, TansuBroker, create_topic, unique_name

PARTITIONS = 8
DEFAULT_SIZES = "100k,500k,5M,1M@1KB"
LABELS = {
    "ours": "(a) ingest",
    "classic": "(a') ingest, classic group",
    "naive": "(b) naive",
    "limit": "(c) limit",
    "ss": "(d) Structured Streaming",
    "kdi": "(e) kafka-delta-ingest",
}
LIMIT_PROCESS = "(c') limit, whole process"


def parse_size(text: str) -> tuple[int, int]:
    """``500k`` -> (500000, 100); ``1M@1KB`` -> (1000000, 1024)."""
    count, _, value = text.partition("@")
    scale = {"k": 1_000, "M": 1_000_000}.get(count[-1], 1)
    records = int(float(count.rstrip("kM")) * scale)
    value_bytes = 100
    if value:
        value_bytes = (
            int(value.upper().removesuffix("KB")) * 1024
            if "KB" in value.upper()
            else int(value.rstrip("B"))
        )
    return records, value_bytes


# -- the peers, each in its own process (``--peer``) ------------------------------------------


def run_peer(args: argparse.Namespace) -> None:
    ends = {int(p): int(n) for p, n in (pair.split(":") for pair in args.ends.split(","))}
    if args.peer == "naive":
        spent = naive_pipeline(
            args.bootstrap,
            args.topic,
            args.group,
            args.table,
            ends,
            OUTPUT_SCHEMA,
            VALUE_SCHEMA.names,
        )
    elif args.peer == "limit":
        spent = limit_pipeline(
            args.bootstrap, args.topic, args.table, ends, DecodeSpec("json", VALUE_SCHEMA)
        )
    else:
        import _structured

        checkpoint = Path(args.table + "_checkpoint")
        if args.peer == "ss":
            spent = _structured.append(
                args.bootstrap, args.topic, Path(args.table), checkpoint, VALUE_DDL
            )
        else:
            spent = _structured.upsert(
                args.bootstrap, args.topic, Path(args.table), checkpoint, VALUE_DDL, "id"
            )
    print("PEER " + json.dumps(spent), flush=True)


def peer_seconds(log: Path) -> dict[str, float]:
    for line in log.read_text().splitlines():
        if line.startswith("PEER "):
            return {k: float(v) for k, v in json.loads(line[5:]).items()}
    raise RuntimeError(f"the peer printed no result; log: {log}")


def run_peer_process(
    peer: str, workdir: Path, bootstrap: str, topic: str, ends: dict[int, int]
) -> dict[str, Any]:
    log = workdir / f"{peer}.log"
    table = workdir / peer
    group = unique_name(peer)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        *("--peer", peer, "--bootstrap", bootstrap, "--topic", topic),
        *("--group", group, "--table", str(table)),
        *("--ends", ",".join(f"{p}:{n}" for p, n in ends.items())),
    ]
    measured = run_measured(argv, log=log, timeout=3600)
    if measured.returncode != 0:
        raise RuntimeError(f"{peer} exited {measured.returncode}; log: {log}")
    spent = peer_seconds(log)
    # The limit is its two timed phases; the others are wall clock, as ours.
    seconds = spent["read"] + spent["write"] if peer == "limit" else measured.seconds
    phases = " ".join(f"{k}={v:.1f}s" for k, v in spent.items())
    result = {"m": measured, "seconds": seconds, "group": group, "phases": phases, "table": table}
    if peer == "limit":
        # The limit as a process of its own, as ours is timed: wall clock from its start
        # (Python, imports, the consumer's start) to its exit, less the Arrow building
        # between its two timed phases, which no pipeline does that way.
        result["process_seconds"] = measured.seconds - spent["prepare_untimed"]
    return result


# -- what kafka-consumer-groups would show ------------------------------------------------------


def committed_lag(bootstrap: str, group: str | None, topic: str, ends: dict[int, int]) -> str:
    """The group's lag from its committed offsets, or why there is none to see."""
    if group is None:
        return "n/a"
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=10)
    finally:
        consumer.close()
    offsets = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
    if not offsets:
        return "no (none committed)"
    lag = sum(end - offsets.get(p, 0) for p, end in ends.items())
    return f"yes (lag {lag})"


def spark_source_groups(bootstrap: str) -> list[str]:
    """Groups named like Spark's Kafka source's (``spark-kafka-source-...``)."""
    from confluent_kafka.admin import AdminClient

    listed = AdminClient({"bootstrap.servers": bootstrap}).list_consumer_groups().result(30)
    return [g.group_id for g in listed.valid if g.group_id.startswith("spark-kafka-source")]


# -- one size -----------------------------------------------------------------------------------


def run_size(
    args: argparse.Namespace, bootstrap: str, workdir: Path, records: int, value_bytes: int
) -> dict[str, dict[str, Any]]:
    per = records // args.partitions
    ends = dict.fromkeys(range(args.partitions), per)
    label = f"{per * args.partitions:,} x {value_bytes} B"
    topic = unique_name(f"bench-e2e-{records}-{value_bytes}")
    create_topic(bootstrap, topic, partitions=args.partitions)
    produced = produce_json(bootstrap, topic, args.partitions, per, value_bytes, idempotent=True)
    print(f"# {label}: produced in {produced:.1f}s", flush=True)
    warm = warm_topic(bootstrap, topic, ends)
    print(f"# {label}: read once untimed, so no pipeline is the broker's first reader: {warm:.1f}s")
    here = workdir / f"{records}-{value_bytes}"
    here.mkdir()
    results: dict[str, dict[str, Any]] = {}
    for name in args.pipelines:
        if name == "kdi" and args.kdi_binary is None:
            continue
        if name in ("ours", "classic"):
            protocol = "consumer" if name == "ours" and args.broker == "kafka" else "classic"
            sections = {"source": {"group_protocol": protocol}}
            result = ingest_until_end(name, here, bootstrap, topic, ends, per, sections=sections)
            result["table"] = here / name
            result["phases"] = result["phases"].describe()
        elif name == "kdi":
            group = unique_name("kdi")
            table = here / "kdi"
            log = here / "kdi.log"
            run = run_kdi(
                args.kdi_binary, bootstrap, topic, group, table, log, ends, args.kdi_latency
            )
            if run.measured.returncode != 0:
                raise RuntimeError(f"kdi exited {run.measured.returncode}; log: {log}")
            if run.complete_seconds is None:
                raise RuntimeError(f"kdi exited 0 without committing every offset; log: {log}")
            # Its seconds and CPU up to the commit that completed the table; the end (the
            # records produced to stop -e, its re-reads) is in the phases.
            cpu = run.measured.cpu_seconds if run.complete_cpu is None else run.complete_cpu
            result = {
                "m": dataclasses.replace(run.measured, cpu_seconds=cpu),
                "seconds": run.complete_seconds,
                "group": group,
                "table": table,
                "phases": run.describe(),
            }
        else:
            result = run_peer_process(name, here, bootstrap, topic, ends)
        result["problem"] = check_exact(result["table"], ends, per)
        group = None if name == "limit" else result["group"]
        if name == "ss":
            found = spark_source_groups(bootstrap)
            result["lag"] = (
                committed_lag(bootstrap, found[-1], topic, ends) if found else ("no (no group)")
            )
        else:
            result["lag"] = committed_lag(bootstrap, group, topic, ends)
        result["label"] = label
        results[name] = result
        print(
            f"# {label} {name}: {result['seconds']:.1f}s exact: {result['problem'] or 'yes'}"
            f" lag visible: {result['lag']} {result.get('phases', '')}",
            flush=True,
        )
    return results


def run_upsert(
    args: argparse.Namespace, bootstrap: str, workdir: Path
) -> dict[str, dict[str, Any]]:
    total, keys = args.upsert_size, args.upsert_keys
    topic = unique_name("bench-e2e-upsert")
    create_topic(bootstrap, topic, partitions=args.partitions)
    produced = produce_changes(bootstrap, topic, args.partitions, total, keys)
    label = f"upsert {total:,} over {keys:,} keys"
    print(f"# {label}: produced in {produced:.1f}s", flush=True)
    here = workdir / "upsert"
    here.mkdir()
    ends = {p: 0 for p in range(args.partitions)}
    for i in range(total):  # the end offset of each partition: its number of events
        ends[(i % keys) % args.partitions] += 1
    results: dict[str, dict[str, Any]] = {}
    for name in ("ours", "ss"):
        if name not in args.pipelines:
            continue
        if name == "ours":
            result = ingest_until_end(
                name,
                here,
                bootstrap,
                topic,
                ends,
                0,
                sections={"table": {"mode": "upsert", "merge_keys": ["id"]}},
                check=lambda table: check_latest(table, total, keys),
            )
            result["table"] = here / name
        else:
            result = run_peer_process("ss-upsert", here, bootstrap, topic, ends)
            result["problem"] = check_latest(result["table"], total, keys)
        result["lag"] = (
            "see append" if name == "ss" else committed_lag(bootstrap, result["group"], topic, ends)
        )
        result["label"] = label
        results[name] = result
        print(
            f"# {label} {name}: {result['seconds']:.1f}s exact: {result['problem'] or 'yes'}",
            flush=True,
        )
    return results


# -- main ---------------------------------------------------------------------------------------


def compile_bytecode() -> str:
    """Compiles ingest's modules to bytecode, as ``pip install`` does, so
    (a) starts as an installed ingest does: a checkout run with PYTHONDONTWRITEBYTECODE=1
    (this workplace sets it) otherwise compiles every module at every process start
    (measured at 100k: 0.02-0.06 s of (a)'s wall time)."""
    import compileall

    for package in ("ingest",):
        if not compileall.compile_dir(ROOT / package, quiet=1):
            raise RuntimeError(f"compiling {package} failed")
    return "ingest compiled first"


def print_table(runs: list[tuple[str, dict[str, dict[str, Any]]]]) -> None:
    print()
    header = f"{'size':26} {'pipeline':26} {'seconds':>8} {'rows/s':>11} {'CPU s':>7}"
    print(f"{header} {'RSS GiB':>8} {'PSS GiB':>8} {'exact':6} lag visible")
    for label, results in runs:
        rows = int(label.split()[0 if not label.startswith("upsert") else 1].replace(",", ""))
        for name, result in results.items():
            m: Measured = result["m"]
            rate = rows / result["seconds"]
            exact = "yes" if result["problem"] is None else "NO"
            print(
                f"{label:26} {LABELS[name]:26} {result['seconds']:8.1f} {rate:11,.0f} "
                f"{m.cpu_seconds:7.1f} {gib(m.peak_rss):8.2f} {gib(m.peak_pss):8.2f} "
                f"{exact:6} {result['lag']}"
            )
            if result["problem"] is not None:
                print(f"{'':26} ^ not exact: {result['problem']}")
            if "process_seconds" in result:
                seconds = result["process_seconds"]
                print(
                    f"{label:26} {LIMIT_PROCESS:26} {seconds:8.1f} {rows / seconds:11,.0f} "
                    f"{'':7} {'':8} {'':8} {'':6} n/a"
                )
    print("(limit: read + write seconds; its memory and CPU include building the Arrow data)")
    print(f"({LIMIT_PROCESS}: the same run's wall clock from its process start to its exit,")
    print(" less its untimed Arrow building: Python start, imports, read and write, as (a))")
    print("(Structured Streaming keeps its offsets in its checkpoint, kafka-delta-ingest in")
    print(" the Delta log's txn actions; the lag column shows what Kafka's tools can see)")
    if any("kdi" in results for _, results in runs):
        print("(kafka-delta-ingest: seconds and CPU to the commit that completed its table; its")
        print(" -e stops only on a record produced after its start: scripts/bench/_kdi.py)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"default {DEFAULT_SIZES}")
    parser.add_argument("--quick", action="store_true", help="--sizes 100k,500k")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--broker", choices=["kafka", "tansu"], default="kafka")
    parser.add_argument("--kdi-binary", type=Path, help="a kafka-delta-ingest binary")
    parser.add_argument(
        "--kdi-latency",
        type=int,
        default=10,
        help="kafka-delta-ingest's --allowed_latency, seconds (default 10): -e writes its last"
        " records only when it expires",
    )
    parser.add_argument("--only", default="ours,naive,limit,ss,kdi", help="pipelines to run")
    parser.add_argument("--upsert", action="store_true", help="also the upsert workload")
    parser.add_argument("--upsert-size", type=lambda t: parse_size(t)[0], default=5_000_000)
    parser.add_argument("--upsert-keys", type=lambda t: parse_size(t)[0], default=500_000)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile the checkout's modules to bytecode first, as pip install does (without"
        " it, with PYTHONDONTWRITEBYTECODE set, every process start compiles them)",
    )
    parser.add_argument(
        "--initial-rebalance-delay-ms", type=int, default=3000, help="Kafka's default: 3000"
    )
    parser.add_argument(
        "--peer", choices=["naive", "limit", "ss", "ss-upsert"], help=argparse.SUPPRESS
    )
    for hidden in ("--bootstrap", "--topic", "--group", "--table", "--ends"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        run_peer(args)
        return
    args.pipelines = [name for name in LABELS if name in args.only.split(",")]
    sizes = [parse_size(text) for text in ("100k,500k" if args.quick else args.sizes).split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-e2e-"))
    bytecode = compile_bytecode() if args.compile else "as found (not compiled first)"
    dont_write = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "unset"
    print(f"# {machine()}; load average before: {load_average()}; broker: {args.broker}")
    print(f"# bytecode: {bytecode}; PYTHONDONTWRITEBYTECODE {dont_write}")
    runs: list[tuple[str, dict[str, dict[str, Any]]]] = []
    try:
        # The broker's own default: a new classic group's first join waits 3 s for others.
        delay = {"group.initial.rebalance.delay.ms": str(args.initial_rebalance_delay_ms)}
        kafka = KafkaCluster(1, overrides=delay) if args.broker == "kafka" else None
        with kafka if kafka is not None else TansuBroker() as broker:
            warm = warm_group_coordinator(broker.bootstrap)
            print(f"# the broker's group coordinator warmed up first, untimed: {warm:.2f} s")
            for records, value_bytes in sizes:
                results = run_size(args, broker.bootstrap, workdir, records, value_bytes)
                runs.append((next(iter(results.values()))["label"], results))
            if args.upsert:
                results = run_upsert(args, broker.bootstrap, workdir)
                if results:
                    runs.append((next(iter(results.values()))["label"], results))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"# load average after: {load_average()}")
    print_table(runs)
    summary(runs, sizes)


def summary(
    runs: list[tuple[str, dict[str, dict[str, Any]]]], sizes: list[tuple[int, int]]
) -> None:
    by_size = {size: results for size, (_, results) in zip(sizes, runs, strict=False)}
    small = [s for s in sizes if s[1] == 100]
    if not small:
        return
    largest = by_size[max(small)]
    parts: list[str] = []

    def ratio(results: dict[str, dict[str, Any]], peer: str) -> float | None:
        if "ours" in results and peer in results:
            return float(results[peer]["seconds"] / results["ours"]["seconds"])
        return None

    for key, results, peer in (
        ("vs_ss", largest, "ss"),
        ("vs_kdi", largest, "kdi"),
        ("vs_naive", largest, "naive"),
        ("vs_limit", largest, "limit"),
        ("small_vs_naive", by_size.get((500_000, 100), {}), "naive"),
        ("small_vs_limit", by_size.get((100_000, 100), {}), "limit"),
    ):
        value = ratio(results, peer)
        if value is not None:
            parts.append(f"{key}={value:.2f}")
    at_100k = by_size.get((100_000, 100), {})
    if "ours" in at_100k and "process_seconds" in at_100k.get("limit", {}):
        # A second figure beside small_vs_limit: the limit timed as a process, as ours is.
        whole = at_100k["limit"]["process_seconds"] / at_100k["ours"]["seconds"]
        parts.append(f"small_vs_limit_process={whole:.2f}")
    exact = all(r["problem"] is None for _, results in runs for r in results.values())
    parts.append(f"exact={str(exact).lower()}")
    if "ours" in largest:
        parts.append(f"peak_rss_gib={gib(largest['ours']['m'].peak_rss):.2f}")
    print("RESULT " + " ".join(parts))


if __name__ == "__main__":
    main()
