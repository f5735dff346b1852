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
* (c) read + write: librdkafka's raw consumer reading every message (nothing built), plus
  one delta-rs write of the same rows as Arrow: read + write seconds (not a pipeline, and
  not a floor: one way of reading and writing; it was called "the limit" before);
* (d) Spark Structured Streaming: ``spark-sql-kafka-0-10`` for the installed Spark,
  ``from_json`` with the same schema, delta-spark's sink, ``Trigger.AvailableNow``, in the
  same local[2] Spark with Delta's jars (``_structured.py``), wall clock like (a);
* (e) kafka-delta-ingest, when ``--kdi-binary PATH`` is given: ``-e``, JSON, its own
  ``kafka.partition``/``kafka.offset`` transforms (``_kdi.py``), seconds from its start to
  the commit that completed its table (``-e`` ends only on a record produced after it
  started, so the harness produces one with no value to each partition then; ``_kdi.py``
  says why).

Sizes (``--sizes``): 100k, 500k and 5M records of 100 B, and 1M of 1 KB (``1M@1KB``). Then
the other workloads (``--skip`` leaves any out):

* upsert: 5M change events over 500k keys (``--upsert-size``, ``--upsert-keys``) into a
  table keyed by ``id``, through (a) ingest's upsert mode and (d) Structured Streaming with
  ``foreachBatch`` + Delta MERGE (latest offset wins in both); kafka-delta-ingest cannot
  upsert;
* avro: 5M Confluent-framed Avro values through the harness's schema registry, (a) against
  (d) with ``from_avro`` (``_avro_e2e.py``);
* continuous: (a) and (d) running continuously at 1 s and 10 s triggers while 100k
  records/s are produced for 3 minutes, each row's produce-to-visible latency
  (``latency.py``'s ``run_trigger``);
* floor: (f) the floor of each size, after the pipelines (``_floor.py``):
  the CPU seconds of the broker serving the topic to Kafka's consumer performance tool
  (f1), of pyarrow's JSON reader parsing the values (f2) and of the Parquet write of the
  table's columns in ingest's layout (f3), each measured alone, summed, over the cores.

``--profile`` runs (a) once more at the largest 100-byte size under Linux ``perf`` (not
timed) and prints its CPU seconds by stage over the whole process tree (``_profile.py``).

``--compile`` compiles the checkout's modules to bytecode first, as ``pip install`` does
(with PYTHONDONTWRITEBYTECODE set, as in this workplace, every process start compiles them
otherwise; the header says which). ``(c')`` beside (c): the same run of it timed as a
process, as (a) is (its wall clock, less the untimed Arrow building between its phases);
``small_vs_read_write_process`` is that figure's ratio at 100k.

Every table is checked exact: every (partition, offset) once, nothing else, each row's
``id`` the one produced at its offset (upsert: one row per key, its last change). Peak
memory is the whole process tree's (sum of VmRSS; Pss too), sampled from /proc every
0.25 s; CPU is the tree's user + system seconds. "lag visible" says whether the group's
committed offsets reach the end, as ``kafka-consumer-groups --describe`` would show them.

    .venv/bin/python scripts/bench/e2e.py                      # everything, ~40 min
    .venv/bin/python scripts/bench/e2e.py --quick              # 100k, 500k, a tenth of the rest
    .venv/bin/python scripts/bench/e2e.py --kdi-binary ~/kdi/target/release/kafka-delta-ingest
    .venv/bin/python scripts/bench/e2e.py --sizes 5M --skip upsert,avro,continuous --profile

The last line is ``RESULT vs_ss=.. vs_kdi=.. vs_naive=.. vs_floor=.. vs_read_write=..
upsert_vs_ss=.. upsert_rss_gib=.. avro_vs_ss=.. small_vs_naive=.. small_vs_read_write=..
p99_1s=.. p99_10s=.. ss_p99_1s=.. ss_p99_10s=.. exact=.. peak_rss_gib=..``
(``_e2e_report.py``): wall time ratios, theirs over ours (above 1: ingest is faster), at the
largest 100-byte size; ``vs_floor`` is the floor's seconds over ours (1 would be the floor
itself); small_vs_naive at 500k, small_vs_read_write at 100k; the p99s in seconds;
peak_rss_gib is ours at the largest size, upsert_rss_gib ours in the upsert workload; exact
covers every table of the run.
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

import _floor
import _profile
import latency
from _avro_e2e import run_avro
from _changes import check_latest, produce_changes
from _e2e_report import LABELS, print_table, result_line
from _kdi import run_kdi
from _peer_process import committed_lag, run_peer_process, spark_source_groups
from _peers import naive_pipeline, read_write_pipeline
from _pipeline import (
    OUTPUT_SCHEMA,
    ROOT,
    VALUE_DDL,
    VALUE_SCHEMA,
    check_exact,
    ingest_until_end,
    load_average,
    machine,
    produce_json,
    warm_group_coordinator,
    warm_topic,
)

from ingest.formats.decode import DecodeSpec
from ingest.testing import KafkaCluster, SchemaRegistry, TansuBroker, create_topic, unique_name

PARTITIONS = 8
DEFAULT_SIZES = "100k,500k,5M,1M@1KB"


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
    elif args.peer == "read_write":
        spent = read_write_pipeline(
            args.bootstrap, args.topic, args.table, ends, DecodeSpec("json", VALUE_SCHEMA)
        )
    else:
        import _structured

        checkpoint = Path(args.table + "_checkpoint")
        if args.peer in ("ss", "ss-avro"):
            avro = Path(args.avro_schema).read_text() if args.peer == "ss-avro" else None
            spent = _structured.append(
                args.bootstrap, args.topic, Path(args.table), checkpoint, VALUE_DDL, avro
            )
        else:
            spent = _structured.upsert(
                args.bootstrap, args.topic, Path(args.table), checkpoint, VALUE_DDL, "id"
            )
    print("PEER " + json.dumps(spent), flush=True)


# -- one size -----------------------------------------------------------------------------------


def run_size(
    args: argparse.Namespace, broker: Any, workdir: Path, records: int, value_bytes: int
) -> tuple[dict[str, dict[str, Any]], _floor.Floor | None]:
    bootstrap = broker.bootstrap
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
        group = None if name == "read_write" else result["group"]
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
    if args.profile and value_bytes == 100 and records == max(r for r, b in args.sizes if b == 100):
        profile_ours(args, here, bootstrap, topic, ends, per)
    floor = None
    if not args.no_floor:
        produced_records = per * args.partitions
        floor = _floor.measure(bootstrap, broker.pid, topic, produced_records, value_bytes, here)
        print(f"# {label} floor: {floor.describe()}", flush=True)
    return results, floor


def profile_ours(
    args: argparse.Namespace,
    here: Path,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    per: int,
) -> None:
    """(a) once more under ``perf`` (not timed): its CPU by stage (``_profile.py``)."""
    perf = _profile.find_perf()
    data = here / "perf.data"
    sections = {"source": {"group_protocol": "consumer" if args.broker == "kafka" else "classic"}}
    result = ingest_until_end(
        "profiled",
        here,
        bootstrap,
        topic,
        ends,
        per,
        sections=sections,
        wrap=_profile.perf_argv(perf, data),
    )
    if result["problem"] is not None:
        raise RuntimeError(f"the profiled run is not exact: {result['problem']}")
    print(
        f"# profiled (a): {result['seconds']:.1f} s under perf, {result['m'].cpu_seconds:.1f} CPU s"
    )
    _profile.print_stages(_profile.stages(perf, data))


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
    warm = warm_topic(bootstrap, topic, ends)
    print(f"# {label}: read once untimed, so no pipeline is the broker's first reader: {warm:.1f}s")
    # As in the other workloads: KIP-848 on Kafka, so no join waits out the classic
    # protocol's initial rebalance delay (3 s; Structured Streaming assigns, no group).
    protocol = "consumer" if args.broker == "kafka" else "classic"
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
                sections={
                    "source": {"group_protocol": protocol},
                    "table": {"mode": "upsert", "merge_keys": ["id"]},
                },
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


def run_continuous(args: argparse.Namespace, bootstrap: str, workdir: Path) -> list[dict[str, Any]]:
    """(a) and (d) continuous at 1 s and 10 s triggers, ``--continuous-rate`` records/s for
    ``--continuous-seconds`` each, produce-to-visible latency (latency.py)."""
    here = workdir / "continuous"
    here.mkdir()
    results = []
    for pipeline in ("ours", "ss"):
        if pipeline not in args.pipelines:
            continue
        for trigger in (1.0, 10.0):
            result = latency.run_trigger(
                here,
                bootstrap,
                args.partitions,
                trigger,
                args.continuous_rate,
                args.continuous_seconds,
                pipeline,
            )
            print(
                f"# continuous {pipeline} {trigger:g}s: p50 {result['p50']:.2f} p99"
                f" {result['p99']:.2f} max {result['max']:.2f} s, {result['records']:,} records,"
                f" exact: {result['problem'] or 'yes'}",
                flush=True,
            )
            results.append(result)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"default {DEFAULT_SIZES}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--sizes 100k,500k, the upsert and Avro workloads at a tenth, 30 s continuous runs",
    )
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
    parser.add_argument("--only", default="ours,naive,read_write,ss,kdi", help="pipelines to run")
    parser.add_argument(
        "--skip",
        default="",
        help="workloads to leave out, comma-separated: upsert, avro, continuous, floor",
    )
    size = lambda t: parse_size(t)[0]  # noqa: E731
    parser.add_argument("--upsert-size", type=size, help="default 5M (--quick: 500k)")
    parser.add_argument("--upsert-keys", type=size, help="default 500k (--quick: 50k)")
    parser.add_argument("--avro-size", type=size, help="default 5M (--quick: 500k)")
    parser.add_argument("--continuous-rate", type=int, default=100_000, help="records/s")
    parser.add_argument("--continuous-seconds", type=float, help="a run; default 180 (--quick: 30)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run (a) once more at the largest 100-byte size under Linux perf and print its"
        " CPU by stage (_profile.py)",
    )
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
        "--peer",
        choices=["naive", "read_write", "ss", "ss-upsert", "ss-avro"],
        help=argparse.SUPPRESS,
    )
    for hidden in ("--bootstrap", "--topic", "--group", "--table", "--ends", "--avro-schema"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        run_peer(args)
        return
    args.pipelines = [name for name in LABELS if name in args.only.split(",")]
    skipped = {name for name in args.skip.split(",") if name}
    unknown = skipped - {"upsert", "avro", "continuous", "floor"}
    if unknown:
        parser.error(f"--skip: unknown workloads {sorted(unknown)}")
    args.upsert, args.avro = "upsert" not in skipped, "avro" not in skipped
    args.continuous, args.no_floor = "continuous" not in skipped, "floor" in skipped
    tenth = 10 if args.quick else 1
    args.upsert_size = args.upsert_size or 5_000_000 // tenth
    args.upsert_keys = args.upsert_keys or 500_000 // tenth
    args.avro_size = args.avro_size or 5_000_000 // tenth
    args.continuous_seconds = args.continuous_seconds or (30.0 if args.quick else 180.0)
    sizes = [parse_size(text) for text in ("100k,500k" if args.quick else args.sizes).split(",")]
    args.sizes = sizes
    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-e2e-"))
    bytecode = compile_bytecode() if args.compile else "as found (not compiled first)"
    dont_write = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "unset"
    print(f"# {machine()}; load average before: {load_average()}; broker: {args.broker}")
    print(f"# bytecode: {bytecode}; PYTHONDONTWRITEBYTECODE {dont_write}")
    runs: list[tuple[str, dict[str, dict[str, Any]]]] = []
    floors: dict[str, _floor.Floor] = {}
    upsert: dict[str, dict[str, Any]] | None = None
    avro: dict[str, dict[str, Any]] | None = None
    latencies: list[dict[str, Any]] = []
    try:
        # The broker's own default: a new classic group's first join waits 3 s for others.
        delay = {"group.initial.rebalance.delay.ms": str(args.initial_rebalance_delay_ms)}
        kafka = KafkaCluster(1, overrides=delay) if args.broker == "kafka" else None
        with kafka if kafka is not None else TansuBroker() as broker:
            warm = warm_group_coordinator(broker.bootstrap)
            print(f"# the broker's group coordinator warmed up first, untimed: {warm:.2f} s")
            for records, value_bytes in sizes:
                results, floor = run_size(args, broker, workdir, records, value_bytes)
                label = next(iter(results.values()))["label"]
                runs.append((label, results))
                if floor is not None:
                    floors[label] = floor
            if args.upsert:
                upsert = run_upsert(args, broker.bootstrap, workdir)
                if upsert:
                    runs.append((next(iter(upsert.values()))["label"], upsert))
            if args.avro:
                with SchemaRegistry() as registry:
                    avro = run_avro(args, broker.bootstrap, registry.url, workdir, args.avro_size)
                if avro:
                    runs.append((next(iter(avro.values()))["label"], avro))
            if args.continuous:
                latencies = run_continuous(args, broker.bootstrap, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"# load average after: {load_average()}")
    print_table(runs, floors)
    if latencies:
        latency.print_latencies(latencies)
    print(result_line(runs, sizes, floors, upsert, avro, latencies), flush=True)


if __name__ == "__main__":
    main()
