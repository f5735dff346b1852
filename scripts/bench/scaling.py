"""Scaling benchmark: ``ingest run --until-end`` on 1, 2, 4 and 8 partitions.

One Tansu broker; for each partition count a fresh topic with the same total of
100-byte JSON records (default 1,000,000, split evenly), landed by the real CLI into
its own table (as e2e.py's (a)). Reports wall-clock rows/s (Spark's start included),
the workers' fetch time (first worker started to last finished, from the log),
the CPU seconds of the whole process tree (supervisor, workers, JVM, Python workers;
from /proc, the broker not counted), CPU microseconds per row, peak summed RSS, and
whether the table is exact.

    .venv/bin/python scripts/bench/scaling.py [--records 1000000] [--partitions 1,2,4,8]

The last line is ``RESULT rows_per_s_1p=<a> ... rows_per_s_8p=<d> exact=<true|false>``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import gib, ingest_until_end, load_average, machine, produce_json

from ingest.testing import TansuBroker, create_topic, unique_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="total, every run")
    parser.add_argument("--partitions", default="1,2,4,8")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    counts = [int(c) for c in args.partitions.split(",")]

    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-scaling-"))
    print(f"# {machine()}; load average before: {load_average()}")
    print(f"# {args.records:,} JSON records of 100 B a run; work dir {workdir}")
    results: dict[int, dict[str, Any]] = {}
    try:
        with TansuBroker() as broker:
            for partitions in counts:
                per = args.records // partitions
                topic = unique_name(f"bench-scaling-{partitions}p")
                create_topic(broker.bootstrap, topic, partitions=partitions)
                produced = produce_json(broker.bootstrap, topic, partitions, per)
                print(f"# {partitions} partitions: produced in {produced:.1f}s", flush=True)
                results[partitions] = ingest_until_end(
                    f"p{partitions}",
                    workdir,
                    broker.bootstrap,
                    topic,
                    dict.fromkeys(range(partitions), per),
                    per,
                )
                results[partitions]["rows"] = per * partitions
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"# load average after: {load_average()}")
    print()
    print(
        f"{'partitions':>10} {'seconds':>8} {'rows/s':>9} {'fetch s':>7} {'spark start':>11} "
        f"{'batches':>8} "
        f"{'batch s':>8} {'CPU s':>7} {'CPU us/row':>10} {'RSS GiB':>8} exact"
    )
    rates = {}
    for partitions, result in results.items():
        m = result["m"]
        phases = result["phases"]
        rows = result["rows"]
        rates[partitions] = rows / m.seconds
        spark = f"{phases.spark_start:.1f}" if phases.spark_start is not None else "?"
        fetch = f"{phases.fetch_seconds:.1f}" if phases.fetch_seconds is not None else "?"
        print(
            f"{partitions:>10} {m.seconds:8.1f} {rates[partitions]:9,.0f} {fetch:>7} {spark:>11} "
            f"{phases.batches:>8} {phases.batch_seconds:8.1f} {m.cpu_seconds:7.1f} "
            f"{m.cpu_seconds / rows * 1e6:10.1f} {gib(m.peak_rss):8.2f} "
            f"{result['problem'] or 'yes'}"
        )
    exact = all(r["problem"] is None for r in results.values())
    figures = " ".join(f"rows_per_s_{p}p={rate:.0f}" for p, rate in rates.items())
    print(f"RESULT {figures} exact={str(exact).lower()}")


if __name__ == "__main__":
    main()
