"""Table maintenance over a simulated 2-hour continuous run: file and log counts, with and without.

A continuous ``ingest run`` with a 10 s trigger makes one Delta commit per batch, with
one small Parquet file per Kafka partition. This bench makes those commits directly
through the sink's code path (``write_data_files`` + ``DeltaTarget.commit_files``,
what the Spark job's driver does after its tasks; no broker, no Spark: a real run
of 720 batches would take two hours), ``--commits`` of them, each
``--partitions`` files of ``--rows`` rows, into two tables:

* without maintenance: delta-rs's defaults only (its post-commit checkpoint every 100
  versions, the 30-day log retention);
* with maintenance: ``ingest.sink.maintenance.maintain.maintain`` every ``--pass-every`` commits
  (10 s x 60 = the default 10-minute interval), with the defaults except the log
  retention, at its floor of 1 h (with the default 30 days the log keeps every
  commit of a 2-hour run).

Time is simulated by file times, which is all Delta's log cleanup and VACUUM judge
by: the run starts 2 h in the past, and after each commit (and pass) every new file
under ``_delta_log`` gets the simulated time of that commit. The data files keep
their real times (VACUUM's 24 h floor deletes nothing in 2 h either way).

Printed at the end: live files (the snapshot), data files on storage, commit files
and checkpoints in ``_delta_log``, for both tables, and their ratios; the last line
is ``RESULT live_files_ratio=<with / without> log_files_ratio=<with / without>``.

    .venv/bin/python scripts/bench/maintenance.py [--commits 720] [--partitions 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from ingest.sink.delta import DeltaTarget
from ingest.sink.files import write_data_files
from ingest.sink.maintenance.maintain import MaintenanceSettings, log_entries, maintain
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id

TRIGGER_S = 10.0


def rows(partition: int, start: int, count: int) -> pa.Table:
    offsets = pa.array(range(start, start + count), pa.int64())
    return pa.table(
        {
            "topic": pa.array(["events"] * count),
            "partition": pa.array([partition] * count, pa.int32()),
            "offset": offsets,
            "value": pa.array([b"x" * 100] * count, pa.binary()),
        }
    )


def stamp_log(root: Path, since: float, moment: float) -> None:
    """Every file of ``_delta_log`` written after ``since`` (real time) gets ``moment``."""
    for path in (root / "_delta_log").iterdir():
        if path.stat().st_mtime >= since:
            os.utime(path, (moment, moment))


def counts(root: Path) -> dict[str, int]:
    commits, checkpoints = log_entries(TableLocation.of(str(root)))
    return {
        "live_files": len(DeltaTable(str(root)).file_uris()),
        "files_on_storage": sum(1 for _ in root.glob("*.parquet")),
        "log_files": commits,
        "checkpoints": checkpoints,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=720)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rows", type=int, default=250)
    parser.add_argument("--pass-every", type=int, default=60)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-maintenance-"))
    settings = MaintenanceSettings(log_retention_seconds=3600)
    try:
        roots = {"without": base / "without", "with": base / "with"}
        targets = {name: DeltaTarget(TableLocation.of(str(root))) for name, root in roots.items()}
        apps = {
            name: {p: app_id(t.uri, "bench", "events", p) for p in range(args.partitions)}
            for name, t in targets.items()
        }
        start = time.time() - args.commits * TRIGGER_S - 60
        seconds = {"commit": 0.0, "pass": 0.0}
        passes = 0
        peak = {"with": 0, "without": 0}
        for number in range(args.commits):
            moment = start + number * TRIGGER_S
            for name, target in targets.items():
                began = time.time()
                batch = pa.concat_tables(
                    [rows(p, number * args.rows, args.rows) for p in range(args.partitions)]
                )
                files = [
                    f
                    for p in range(args.partitions)
                    for f in write_data_files(
                        batch.filter(pa.compute.equal(batch.column("partition"), p)),
                        target.location,
                        name=f"part-{number}-{p}",
                    )
                ]
                ids = apps[name]
                target.commit_files(
                    files,
                    {ids[p]: (number + 1) * args.rows - 1 for p in ids},
                    batch.schema,
                    planned=target.versions(list(ids.values())),
                    app_id_of=lambda t, p, ids=ids: ids[p],  # type: ignore[misc]
                )
                seconds["commit"] += time.time() - began
                if name == "with" and (number + 1) % args.pass_every == 0:
                    began = time.time()
                    maintain(target.location, settings)
                    seconds["pass"] += time.time() - began
                    passes += 1
                stamp_log(roots[name], began - 1, moment)
                peak[name] = max(peak[name], len(DeltaTable(target.uri).file_uris()))
        result = {name: counts(root) for name, root in roots.items()}
        rows_each = {n: DeltaTable(str(r)).to_pyarrow_table().num_rows for n, r in roots.items()}
        assert (
            rows_each["with"]
            == rows_each["without"]
            == args.commits * args.rows * (args.partitions)
        ), rows_each
        print(
            f"{args.commits} commits x {args.partitions} files of {args.rows} rows "
            f"({args.commits * TRIGGER_S / 3600:g} h at a {TRIGGER_S:g} s trigger), "
            f"{passes} maintenance passes (every {args.pass_every} commits), both tables "
            f"{rows_each['with']} rows"
        )
        print(f"{'':18}{'without':>10}{'with':>10}{'ratio':>10}")
        for key in ("live_files", "files_on_storage", "log_files", "checkpoints"):
            a, b = result["without"][key], result["with"][key]
            print(f"{key:18}{a:>10}{b:>10}{(b / a if a else float('nan')):>10.3f}")
        print(f"{'peak live files':18}{peak['without']:>10}{peak['with']:>10}")
        print(
            f"time: {seconds['commit']:.1f} s of commits (both tables), "
            f"{seconds['pass']:.1f} s in {passes} passes "
            f"({seconds['pass'] / max(passes, 1):.2f} s each)"
        )
        live = result["with"]["live_files"] / result["without"]["live_files"]
        logs = result["with"]["log_files"] / result["without"]["log_files"]
        print(f"RESULT live_files_ratio={live:.4f} log_files_ratio={logs:.4f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
