"""Throughput within a small handoff: 32 MiB, 64 MiB and 1 GiB of tmpfs against an unbounded one.

One Apache Kafka node (the harness's); 2,000,000 JSON records of 100 bytes produced once
to 4 partitions (``--quick``: 400,000), then, in turn, on the same topic, each with its own
group and table, ``ingest run --until-end`` (the CLI as a subprocess, local[2] Spark, the
product's default handoff sizes) with the handoff (shm mode) on:

* a tmpfs of 32 MiB, 64 MiB and 1 GiB, mounted by this script (needs root), as a
  container's ``/dev/shm`` is sized;
* the peer: the machine's own ``/dev/shm`` (unbounded for this run), measured last in
  the same run.

Each table is checked exact. The space plan the run chose (from its ``handoff_plan`` log
events) and how often a worker found the handoff full are printed with each.

    .venv/bin/python scripts/bench/handoff_space.py           # 2M records
    .venv/bin/python scripts/bench/handoff_space.py --quick   # 400k records

The last line is ``RESULT 32MiB=<x> 64MiB=<y> 1GiB=<z> exact=<true|false>``: rows/s of
each size over the unbounded run's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import (
    check_exact,
    ingest_argv,
    load_average,
    log_events,
    machine,
    produce_json,
    run_measured,
    run_phases,
    write_config,
)

from ingest.testing import KafkaCluster, create_topic, unique_name
from ingest.testing.tmpfs import mount_refusal, small_tmpfs

PARTITIONS = 4
MIB = 1024 * 1024
SIZES = {"32MiB": 32 * MIB, "64MiB": 64 * MIB, "1GiB": 1024 * MIB}


def one_run(
    name: str, root: str, workdir: Path, bootstrap: str, topic: str, ends: dict[int, int], per: int
) -> dict[str, Any]:
    table = workdir / name
    config = write_config(
        workdir / f"{name}.toml",
        bootstrap=bootstrap,
        topic=topic,
        group=unique_name(name),
        table=table,
        sections={"handoff": {"mode": "shm", "root": root}},
    )
    log = workdir / f"{name}.log"
    measured = run_measured(ingest_argv(config, "--until-end"), log=log, timeout=1800)
    if measured.returncode != 0:
        raise RuntimeError(f"{name}: ingest exited {measured.returncode}; log: {log}")
    events = log_events(log)
    plans = [e for e in events if e.get("event") == "handoff_plan"]
    full = sum(1 for e in events if e.get("event") == "handoff_full")
    plan = plans[-1] if plans else None
    problem = check_exact(table, ends, per)
    phases = run_phases(log)
    planned = (
        f"segments {plan['segment_max_bytes'] / MIB:.1f} MiB, cap "
        f"{plan['max_buffered_bytes'] / MIB:.1f} MiB"
        if plan
        else "the configured sizes"
    )
    print(
        f"# {name}: {measured.seconds:.1f}s, exact: {problem or 'yes'}; {planned}; "
        f"handoff_full x{full}; {phases.describe()}",
        flush=True,
    )
    return {
        "seconds": measured.seconds,
        "problem": problem,
        "batches": phases.batches,
        "planned": planned,
        "full": full,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="400,000 records")
    parser.add_argument("--records", type=int, help="total records (default 2M, quick 400k)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    refusal = mount_refusal()
    if refusal is not None:
        raise SystemExit(f"cannot measure: {refusal}")

    total = args.records or (400_000 if args.quick else 2_000_000)
    per = total // PARTITIONS
    total = per * PARTITIONS
    ends = dict.fromkeys(range(PARTITIONS), per)
    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-space-"))
    print(f"# {machine()}; load average before: {load_average()}")
    print(f"# {total:,} JSON records of 100 B, {PARTITIONS} partitions; work dir {workdir}")
    results: dict[str, dict[str, Any]] = {}
    try:
        with KafkaCluster() as broker:
            topic = unique_name("bench-space")
            create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
            produced = produce_json(broker.bootstrap, topic, PARTITIONS, per)
            print(f"# produced in {produced:.1f}s ({total / produced:,.0f}/s)", flush=True)
            for name, size in SIZES.items():
                with small_tmpfs(size, base=workdir) as root:
                    results[name] = one_run(
                        name, str(root), workdir, broker.bootstrap, topic, ends, per
                    )
            # The peer runs last: the first run after the produce is the slowest (measured
            # 9.1-12.1 s against 8.3-11.3 s for the same sizes run later), so the small
            # sizes are compared with a warm peer, never a cold one.
            results["unbounded"] = one_run(
                "unbounded", "/dev/shm", workdir, broker.bootstrap, topic, ends, per
            )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"# load average after: {load_average()}")
    print()
    print(f"{'handoff':10} {'seconds':>8} {'rows/s':>11} {'batches':>8} {'full':>5}  plan")
    rate = {name: total / r["seconds"] for name, r in results.items()}
    for name, result in results.items():
        print(
            f"{name:10} {result['seconds']:8.1f} {rate[name]:11,.0f} {result['batches']:8d} "
            f"{result['full']:5d}  {result['planned']}"
        )
    exact = all(r["problem"] is None for r in results.values())
    ratios = " ".join(f"{name}={rate[name] / rate['unbounded']:.2f}" for name in SIZES)
    print(f"RESULT {ratios} exact={str(exact).lower()}")


if __name__ == "__main__":
    main()
