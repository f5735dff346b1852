"""End-to-end benchmark: a topic into a Delta table, ours against a naive pipeline and the limit.

One Tansu broker (memory storage); 5,000,000 JSON records of 100 bytes produced once to
8 partitions (``--quick``: 500,000), then, in turn, on the same topic, each with its own
group and table:

* (a) ours: ``ingest run --until-end`` (the CLI as a subprocess, local[2] Spark, JSON
  value schema declared in the config), timed wall clock from process start to exit,
  the JVM's start included;
* (b) naive: a confluent-kafka group consumer, orjson per value into the same columns,
  a pyarrow table per 100k messages, ``deltalake.write_deltalake`` append, a synchronous
  offset commit after each write (a subprocess, timed wall clock likewise);
* (c) limit: librdkafka's raw consumer reading every message (nothing built), plus one
  delta-rs write of the same rows as Arrow: read + write seconds.

Each table is checked exact: every (partition, offset) once, nothing else, and each row's
``id`` the one produced at its offset. Peak memory is the process tree's (the ingest
supervisor, its workers, the Spark JVM and its Python workers; the broker is not counted),
sampled from /proc every 0.25 s: the sum of VmRSS (the headline; shared pages count once per
process) and the sum of Pss.

    .venv/bin/python scripts/bench/e2e.py            # 5M records, about 4 minutes
    .venv/bin/python scripts/bench/e2e.py --quick    # 500k records

The last line is
``RESULT vs_naive=<x> vs_limit=<y> exact=<true|false> peak_rss_gib=<z>``: x and y are ratios
of rows/s (ours over theirs), z is ours.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _peers import limit_pipeline, naive_pipeline
from _pipeline import (
    OUTPUT_SCHEMA,
    VALUE_SCHEMA,
    Measured,
    check_exact,
    gib,
    ingest_until_end,
    load_average,
    machine,
    produce_json,
    run_measured,
)

from ingest.testing import TansuBroker, create_topic, unique_name
from spark_jobs.decode import DecodeSpec

PARTITIONS = 8


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
    else:
        spent = limit_pipeline(
            args.bootstrap, args.topic, args.table, ends, DecodeSpec("json", VALUE_SCHEMA)
        )
    print("PEER " + json.dumps(spent), flush=True)


def peer_seconds(log: Path) -> dict[str, float]:
    for line in log.read_text().splitlines():
        if line.startswith("PEER "):
            return {k: float(v) for k, v in json.loads(line[5:]).items()}
    raise RuntimeError(f"the peer printed no result; log: {log}")


def run_peer_process(
    peer: str, workdir: Path, bootstrap: str, topic: str, ends: dict[int, int], per: int
) -> dict[str, Any]:
    log = workdir / f"{peer}.log"
    table = workdir / peer
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        *("--peer", peer, "--bootstrap", bootstrap, "--topic", topic),
        *("--group", unique_name(peer), "--table", str(table)),
        *("--ends", ",".join(f"{p}:{n}" for p, n in ends.items())),
    ]
    measured = run_measured(argv, log=log, timeout=1800)
    if measured.returncode != 0:
        raise RuntimeError(f"{peer} exited {measured.returncode}; log: {log}")
    spent = peer_seconds(log)
    # The limit is its two timed phases; the naive pipeline is wall clock, as ours.
    seconds = spent["read"] + spent["write"] if peer == "limit" else measured.seconds
    problem = check_exact(table, ends, per)
    phases = " ".join(f"{k}={v:.1f}s" for k, v in spent.items())
    print(f"# {peer}: {seconds:.1f}s, exact: {problem or 'yes'}; {phases}", flush=True)
    return {"m": measured, "seconds": seconds, "problem": problem}


LABELS = {
    "ours": "(a) ingest run --until-end (wall clock)",
    "naive": "(b) confluent-kafka + orjson + write_deltalake",
    "limit": "(c) librdkafka raw read + one delta-rs write",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500,000 records")
    parser.add_argument("--records", type=int, help="total records (default 5M, quick 500k)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--only", default="ours,naive,limit", help="a subset to run (RESULT needs all three)"
    )
    parser.add_argument("--peer", choices=["naive", "limit"], help=argparse.SUPPRESS)
    for hidden in ("--bootstrap", "--topic", "--group", "--table", "--ends"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        run_peer(args)
        return

    total = args.records or (500_000 if args.quick else 5_000_000)
    per = total // args.partitions
    total = per * args.partitions
    ends = dict.fromkeys(range(args.partitions), per)
    chosen = [name for name in LABELS if name in args.only.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-e2e-"))
    print(f"# {machine()}; load average before: {load_average()}")
    print(f"# {total:,} JSON records of 100 B, {args.partitions} partitions; work dir {workdir}")
    results: dict[str, dict[str, Any]] = {}
    try:
        with TansuBroker() as broker:
            bootstrap = broker.bootstrap
            topic = unique_name("bench-e2e")
            create_topic(bootstrap, topic, partitions=args.partitions)
            produced = produce_json(bootstrap, topic, args.partitions, per)
            print(f"# produced in {produced:.1f}s ({total / produced:,.0f}/s)", flush=True)
            for name in chosen:
                if name == "ours":
                    results[name] = ingest_until_end(name, workdir, bootstrap, topic, ends, per)
                else:
                    results[name] = run_peer_process(name, workdir, bootstrap, topic, ends, per)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"# load average after: {load_average()}")
    print()
    header = f"{'pipeline':48} {'seconds':>8} {'rows/s':>11} {'RSS GiB':>8} {'PSS GiB':>8}"
    print(f"{header} {'CPU s':>7} exact")
    rate = {name: total / r["seconds"] for name, r in results.items()}
    for name, result in results.items():
        m: Measured = result["m"]
        print(
            f"{LABELS[name]:48} {result['seconds']:8.1f} {rate[name]:11,.0f} "
            f"{gib(m.peak_rss):8.2f} {gib(m.peak_pss):8.2f} {m.cpu_seconds:7.1f} "
            f"{result['problem'] or 'yes'}"
        )
    for name, result in results.items():
        spent = ", ".join(f"{k} {v:.1f}" for k, v in result["m"].cpu_by_kind.items())
        print(f"# CPU s of {name}: {spent}")
    print("(peak memory and CPU: the whole process tree; for (c) they include building the")
    print(" Arrow data between the timed read and write)")
    if {"ours", "naive", "limit"} <= set(results):
        exact = all(r["problem"] is None for r in results.values())
        print(
            f"RESULT vs_naive={rate['ours'] / rate['naive']:.2f} "
            f"vs_limit={rate['ours'] / rate['limit']:.2f} exact={str(exact).lower()} "
            f"peak_rss_gib={gib(results['ours']['m'].peak_rss):.2f}"
        )


if __name__ == "__main__":
    main()
