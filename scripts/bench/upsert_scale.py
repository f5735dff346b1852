"""Upsert at scale: a batch MERGEd into a large table by delta-rs in the driver, or by Delta Spark.

Issue 17 item 4. A ``--rows`` table (20M by default) keyed by ``id``, with the columns an
upsert table written by ingest has (the Kafka columns topic, partition, offset, timestamp,
timestamp_type, key, headers, then the JSON value's id, user, amount, kind, ts, pad: the
e2e bench's values), spread over ``--partitions`` Kafka partitions (a key's partition is
``id % partitions``, as a keyed producer's would be fixed), written through the sink's own
``write_data_files`` + ``DeltaTarget.commit_files`` with its txn actions. A ``--batch`` of
rows (1M by default): 65% updates of distinct existing keys drawn uniformly over the whole
table, 5% second updates of some of those keys (higher offsets: the dedupe must keep them),
30% new keys, every offset above the table's txn version of its partition, staged as 4
Parquet files under ``_ingest_staging/<token>`` as the Spark tasks of ``land`` stage them.
Both are built once and cached under ``--work`` (default: a temporary directory, removed at
the end unless ``--keep``).

Then, each from the same copy of the table and in its own process (so peak memory is its
own), timed from the staged files to the durable commit:

* **(a) delta-rs**: ingest's upsert as ``land`` runs it, ``merge.upsert_source`` (read the
  staged files back) then ``merge.upsert`` (re-filter by txn versions, dedupe, delta-rs
  MERGE in the driver with the latest-offset-wins clause and the batch's txn actions);
* **(b) Delta Spark**: ``local[2]``, the session as ``ingest run`` starts it
  (``start_session`` with ``spark_env.session_settings``, C2 kept); the staged files read by
  Spark, re-filtered by the table's txn versions, deduplicated by a window (highest offset per
  key), ``DeltaTable.forPath(...).merge`` with the same clauses, carrying the rewrite guard's
  txn through ``spark.databricks.delta.write.txnAppId``/``txnVersion`` (a Spark MERGE can
  carry one txn only), then ONE delta-rs commit of the batch's per-partition txn actions
  (``DeltaTarget.commit_txns``). The session's start is timed apart: in ``ingest run`` it is
  already up.

Memory: the process tree sampled from /proc every 0.1 s (``_pipeline.TreeSampler``: sum of
VmRSS and of Pss), and each process's exact peak from ``getrusage`` (the Python driver's
``RUSAGE_SELF``; for (b) its largest child, the JVM, from ``RUSAGE_CHILDREN`` at exit).
After both, a Spark job reads the two resulting tables and checks they are the same: row
count, distinct keys, a checksum of every column (sum of ``xxhash64`` over each row, as a
decimal), the batch's rows (count and sum of offsets: the later of a key's two updates won),
and each partition's txn version; and against what the data says they must hold.

    PYTHONPATH=. .venv/bin/python scripts/bench/upsert_scale.py \
        [--rows 20000000] [--batch 1000000] [--work /tmp/upsert-bench] [--keep] [--only a,b]

The last line is ``RESULT spark_vs_deltars_time=<(b) / (a)> spark_vs_deltars_peak_rss=...``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import ROOT, TreeSampler

from ingest.sink.delta import DeltaTarget
from ingest.sink.files import DataFile, write_data_files
from ingest.sink.land import STAGING
from ingest.sink.merging.merge import UPDATE_WHEN, merge_predicate
from ingest.sink.storage import TableLocation
from ingest.sink.txn import REWRITE_GUARD, app_id, or_minus_one

TOPIC = "customers"
GROUP = "ingest-bench"
KEYS = ("id",)
CHUNK = 1_000_000  # rows per data file of the table, and per generation step
STAGED_FILES = 4
BASE_MS = 1_700_000_000_000
BATCH_MS = BASE_MS + 10**12  # after any table row's time: the batch's rows are told by it
KINDS = ["view", "click", "purchase", "refund"]
GIB = 1024**3


def value_schema() -> pa.Schema:
    from ingest.formats.decode import DecodeSpec

    values = pa.schema(
        [
            ("id", pa.int64()),
            ("user", pa.string()),
            ("amount", pa.float64()),
            ("kind", pa.string()),
            ("ts", pa.int64()),
            ("pad", pa.string()),
        ]
    )
    # What the Spark tasks write for [table.value] format = "json" with that schema.
    return DecodeSpec("json", values).output_schema()


# -- data ------------------------------------------------------------------------------------


def rows_of(
    schema: pa.Schema,
    ids: np.ndarray,
    offsets: np.ndarray,
    partitions: int,
    *,
    seed: int,
    from_ms: int = BASE_MS,
) -> pa.Table:
    """Rows of ``ids`` at ``offsets`` (each in partition ``id % partitions``); ``seed`` makes
    the values (amount, pad) differ between the table and the batch; the Kafka timestamps
    (and ``ts``) are ``from_ms`` + 10 ms per offset."""
    rng = np.random.default_rng(seed)
    count = len(ids)
    ids_array = pa.array(ids, pa.int64())
    stamps = from_ms + offsets * 10
    pad = rng.integers(97, 123, size=count * 24, dtype=np.uint8)
    pad_offsets = np.arange(0, (count + 1) * 24, 24, dtype=np.int32)
    headers_type = schema.field("headers").type
    columns: dict[str, pa.Array] = {
        "topic": pa.array([TOPIC] * count, pa.string()),
        "partition": pa.array((ids % partitions).astype(np.int32)),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array(stamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array(np.zeros(count, np.int8)),
        "key": pc.cast(pc.cast(ids_array, pa.string()), pa.binary()),
        "headers": pa.ListArray.from_arrays(
            pa.array(np.zeros(count + 1, np.int32)),
            pa.array([], headers_type.value_type),
            type=headers_type,
        ),
        "id": ids_array,
        "user": pc.binary_join_element_wise(
            "user-", pc.cast(pa.array(ids % 100_000), pa.string()), ""
        ),
        "amount": pa.array(np.round(rng.random(count) * 1000, 2)),
        "kind": pc.take(pa.array(KINDS), pa.array(ids % len(KINDS))),
        "ts": pa.array(stamps, pa.int64()),
        "pad": pa.Array.from_buffers(
            pa.string(), count, [None, pa.py_buffer(pad_offsets), pa.py_buffer(pad)]
        ),
    }
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def build(directory: Path, rows: int, batch: int, partitions: int) -> None:
    """The table (``base``), the staged batch (``batch``) and what both must give
    (``meta.json``)."""
    schema = value_schema()
    base = directory / "base"
    if base.exists():
        shutil.rmtree(base)
    table_uri = str(directory / "table")  # where every run's table sits (the app ids' URI)
    apps = {p: app_id(table_uri, GROUP, TOPIC, p) for p in range(partitions)}
    location = TableLocation.of(str(base))
    began = time.perf_counter()
    files: list[DataFile] = []
    for start in range(0, rows, CHUNK):
        ids = np.arange(start, min(rows, start + CHUNK), dtype=np.int64)
        chunk = rows_of(schema, ids, ids // partitions, partitions, seed=start)
        files += write_data_files(chunk, location, name=f"part-base-{start // CHUNK:05d}")
    # Every partition's last offset: ids run 0..rows-1, id // partitions is the offset.
    last = {p: (rows - 1 - p) // partitions for p in range(partitions)}
    DeltaTarget(location).commit_files(
        files,
        {apps[p]: last[p] for p in range(partitions)},
        schema,
        planned=dict.fromkeys(apps.values()),
        app_id_of=lambda _t, p: apps[p],
    )
    built = time.perf_counter() - began

    rng = np.random.default_rng(17)
    updates = int(batch * 0.65)
    again = int(batch * 0.05)
    new = batch - updates - again
    updated = rng.choice(rows, size=updates, replace=False).astype(np.int64)
    fresh = np.arange(rows, rows + new, dtype=np.int64)
    first = np.concatenate([updated, fresh])
    rng.shuffle(first)
    # The second updates come last, so each has the higher offset in its partition.
    ids = np.concatenate([first, rng.choice(updated, size=again, replace=False)])
    parts = ids % partitions
    offsets = np.empty(len(ids), np.int64)
    for p in range(partitions):
        mask = parts == p
        offsets[mask] = last[p] + 1 + np.arange(int(mask.sum()), dtype=np.int64)
    source = rows_of(schema, ids, offsets, partitions, seed=rows + 1, from_ms=BATCH_MS)
    staged = directory / "batch"
    if staged.exists():
        shutil.rmtree(staged)
    staged_location = TableLocation.of(str(staged))
    token = uuid.uuid4().hex[:16]
    per_file = -(-len(ids) // STAGED_FILES)
    staged_files: list[DataFile] = []
    for number in range(STAGED_FILES):
        part = source.slice(number * per_file, per_file)
        staged_files += write_data_files(
            part, staged_location, name=f"part-{token}-{number}", prefix=f"{STAGING}/{token}"
        )
    # What the merge must leave: one row per distinct key of the batch, at its last offset.
    latest: dict[int, int] = {}
    for key, offset in zip(ids.tolist(), offsets.tolist(), strict=True):
        latest[key] = max(offset, latest.get(key, -1))
    batch_last = {p: int(offsets[parts == p].max()) for p in range(partitions)}
    meta = {
        "rows": rows,
        "batch": batch,
        "partitions": partitions,
        "table_uri": table_uri,
        "apps": {str(p): a for p, a in apps.items()},
        "txns": {apps[p]: batch_last[p] for p in range(partitions)},
        "base_txns": {apps[p]: last[p] for p in range(partitions)},
        "staged": [f.to_json() for f in staged_files],
        "token": token,
        "expected_rows": rows + new,
        "expected_batch_rows": len(latest),
        "expected_batch_offset_sum": sum(latest.values()),
        "batch_from_ms": BATCH_MS,
        "build_seconds": built,
        "base_bytes": sum(f.size for f in files),
        "batch_bytes": sum(f.size for f in staged_files),
    }
    (directory / "meta.json").write_text(json.dumps(meta, indent=1))


# -- the two paths (each in its own process) -------------------------------------------------


def staged_files(meta: dict[str, Any]) -> list[DataFile]:
    return [DataFile.from_json(text) for text in meta["staged"]]


def run_deltars(directory: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """(a): what ``land`` does for an upsert from the staged files on."""
    from ingest.sink.merging.merge import upsert
    from ingest.sink.merging.staged import upsert_source

    apps = {int(p): a for p, a in meta["apps"].items()}
    location = TableLocation.of(meta["table_uri"])
    target = DeltaTarget(location)
    began = time.perf_counter()
    source, keyless = upsert_source(location, staged_files(meta), value_schema(), KEYS)
    assert keyless is None
    read = time.perf_counter()
    outcome = upsert(
        target,
        source,
        merge_keys=KEYS,
        txns=meta["txns"],
        app_id_of=lambda _topic, partition: apps[partition],
    )
    done = time.perf_counter()
    return {
        "seconds": done - began,
        "phases": {"read staged": read - began, "merge + txns": done - read},
        "version": outcome.version,
        "rows_changed": outcome.rows,
    }


def run_spark(directory: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """(b): the staged files MERGEd by Delta Spark, then one delta-rs commit of the txns."""
    from delta.tables import DeltaTable as SparkDeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from ingest.config.sections import SparkSection
    from ingest.engines.spark.spark_session import start_session
    from ingest.spark_env import session_settings

    began = time.perf_counter()
    conf = dict(item.split("=", 1) for item in meta.get("spark_conf", []))
    spark, _ = start_session(
        SparkSection(
            master="local[2]", app_name="upsert-bench", conf=conf, class_data_sharing=False
        ),
        environment=session_settings(),
    )
    started = time.perf_counter()
    uri = meta["table_uri"]
    location = TableLocation.of(uri)
    target = DeltaTarget(location)
    table = target.load()
    assert table is not None
    current = DeltaTarget.versions_in(table, list(meta["txns"]))
    apps = {int(p): a for p, a in meta["apps"].items()}
    rows = spark.read.parquet(*[f"{uri}/{f.path}" for f in staged_files(meta)])
    # The re-filter: offsets the table's txn versions cover are dropped.
    for partition, app in apps.items():
        version = current.get(app)
        if version is not None:
            rows = rows.where(
                ~((F.col("topic") == TOPIC) & (F.col("partition") == partition))
                | (F.col("offset") > version)
            )
    latest = Window.partitionBy(*KEYS).orderBy(F.col("offset").desc())
    rows = rows.withColumn("__rank", F.row_number().over(latest)).where("__rank = 1")
    rows = rows.drop("__rank")
    guard = or_minus_one(table.transaction_version(REWRITE_GUARD)) + 1
    spark.conf.set("spark.databricks.delta.write.txnAppId", REWRITE_GUARD)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(guard))
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", meta["token"])
    planned = time.perf_counter()
    (
        SparkDeltaTable.forPath(spark, uri)
        .alias("t")
        .merge(rows.alias("s"), merge_predicate(KEYS))
        .whenMatchedUpdateAll(condition=UPDATE_WHEN)
        .whenNotMatchedInsertAll()
        .execute()
    )
    merged = time.perf_counter()
    for key in ("txnAppId", "txnVersion"):
        spark.conf.unset(f"spark.databricks.delta.write.{key}")
    after = target.load()
    assert after is not None
    if after.transaction_version(REWRITE_GUARD) != guard:
        raise RuntimeError(f"the MERGE did not carry the guard's txn {guard}")
    merge_version = after.version()
    outcome = target.commit_txns(
        {a: v for a, v in meta["txns"].items() if v > or_minus_one(current.get(a))},
        value_schema(),
    )
    done = time.perf_counter()
    return {
        "seconds": done - started,
        "session_start_seconds": started - began,
        "phases": {
            "plan": planned - started,
            "spark merge": merged - planned,
            "txn commit": done - merged,
        },
        "version": outcome.version,
        "merge_version": merge_version,
    }


def children_peak() -> int:
    """The highest peak RSS (VmHWM) of this process's live children: the Spark JVM, which
    is not waited for before this process exits, so RUSAGE_CHILDREN does not count it."""
    peak = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != os.getpid():
                continue
            for line in Path(f"/proc/{name}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
        except (OSError, ValueError):
            continue  # gone
    return peak


def child(step: str, directory: Path) -> None:
    meta = json.loads((directory / "meta.json").read_text()) if step != "build" else {}
    if step == "build":
        args = json.loads((directory / "build.json").read_text())
        build(directory, **args)
        result: dict[str, Any] = {}
    elif step == "a":
        result = run_deltars(directory, meta)
    elif step == "b":
        result = run_spark(directory, meta)
    elif step == "verify":
        result = verify(directory, meta)
    else:
        raise SystemExit(f"unknown step {step}")
    result["self_max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["children_max_rss"] = max(
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, children_peak()
    )
    (directory / f"result-{step}.json").write_text(json.dumps(result))


# -- verification ------------------------------------------------------------------------------


def verify(directory: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Each result table's count, distinct keys, checksum, batch rows, txn versions."""
    from deltalake import DeltaTable

    from ingest.testing.spark import local_spark_session

    spark = local_spark_session(
        app_name="upsert-bench-verify", extra_conf={"spark.driver.memory": "2g"}
    )
    columns = ", ".join(f"`{f.name}`" for f in value_schema())
    figures: dict[str, Any] = {}
    for name in ("a", "b"):
        path = directory / f"result-{name}"
        if not path.exists():
            continue
        spark.read.format("delta").load(str(path)).createOrReplaceTempView("result")
        row = spark.sql(
            f"""SELECT count(*) AS rows, count(DISTINCT id) AS keys,
                CAST(sum(CAST(xxhash64(id) AS DECIMAL(38, 0))) AS STRING) AS key_sum,
                CAST(sum(CAST(xxhash64({columns}) AS DECIMAL(38, 0))) AS STRING) AS checksum,
                count_if(ts >= {meta["batch_from_ms"]}) AS batch_rows,
                sum(CASE WHEN ts >= {meta["batch_from_ms"]} THEN `offset` END) AS batch_offsets
                FROM result"""
        ).collect()[0]
        table = DeltaTable(str(path))
        figures[name] = {
            **row.asDict(),
            "txns": {app: table.transaction_version(app) for app in meta["txns"]},
            "version": table.version(),
            "files": len(table.file_uris()),
        }
    spark.stop()
    return figures


# -- the run -------------------------------------------------------------------------------------


def measured(step: str, directory: Path, log: Path) -> dict[str, Any]:
    """Runs ``step`` in a child process, sampling its process tree."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).strip(os.pathsep)
    argv = [sys.executable, __file__, "--step", step, "--dir", str(directory)]
    with open(log, "w") as out:
        began = time.perf_counter()
        process = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        with TreeSampler(process.pid, interval=0.1) as sampler:
            code = process.wait()
        wall = time.perf_counter() - began
    if code != 0:
        raise SystemExit(f"step {step} failed ({code}); log: {log}")
    result: dict[str, Any] = json.loads((directory / f"result-{step}.json").read_text())
    result.update(
        process_seconds=wall,
        tree_peak_rss=sampler.peak_rss,
        tree_peak_pss=sampler.peak_pss,
        cpu_seconds=sampler.cpu_seconds,
        cpu_by_kind=sampler.cpu_by_kind(),
    )
    return result


def fresh_table(directory: Path, meta: dict[str, Any]) -> None:
    """The base table, copied to the runs' URI, with the batch staged inside it."""
    table = Path(meta["table_uri"])
    if table.exists():
        shutil.rmtree(table)
    shutil.copytree(directory / "base", table)
    shutil.copytree(directory / "batch" / STAGING, table / STAGING)


def peak(result: dict[str, Any]) -> int:
    """A path's peak RSS: the tree's sampled sum, or a single process's exact peak when
    higher (a sample can miss a short peak)."""
    return max(int(result[k]) for k in ("tree_peak_rss", "self_max_rss", "children_max_rss"))


def gib(value: float) -> str:
    return f"{value / GIB:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep --work's tables")
    parser.add_argument("--only", default="a,b", help="a (delta-rs), b (Spark) or a,b")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [spark] conf entry for (b)'s session (repeatable; none: the product's defaults)",
    )
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        child(args.step, args.dir)
        return

    work = args.work or Path(tempfile.mkdtemp(prefix="upsert-bench-"))
    directory = work / f"rows{args.rows}-batch{args.batch}-p{args.partitions}"
    directory.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    print(f"work {directory}, load {load:.1f}", flush=True)
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), flush=True)
    if not (directory / "meta.json").exists():
        (directory / "build.json").write_text(
            json.dumps({"rows": args.rows, "batch": args.batch, "partitions": args.partitions})
        )
        built = measured("build", directory, directory / "build.log")
        print(f"built in {built['process_seconds']:.1f}s", flush=True)
    meta = json.loads((directory / "meta.json").read_text())
    if args.spark_conf:
        print(f"(b)'s session conf: {args.spark_conf}")
    meta["spark_conf"] = args.spark_conf
    (directory / "meta.json").write_text(json.dumps(meta, indent=1))
    print(
        f"table {meta['rows']:,} rows in {gib(meta['base_bytes'])} GiB of Parquet; batch "
        f"{meta['batch']:,} rows ({meta['expected_batch_rows']:,} distinct keys, "
        f"{meta['expected_rows'] - meta['rows']:,} new) in {gib(meta['batch_bytes'])} GiB",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    for name in args.only.split(","):
        fresh_table(directory, meta)
        results[name] = measured(name, directory, directory / f"{name}.log")
        result = directory / f"result-{name}"
        if result.exists():
            shutil.rmtree(result)
        Path(meta["table_uri"]).rename(result)
        r = results[name]
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in r["phases"].items())
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_by_kind"].items() if v >= 0.05)
        print(
            f"({name}) {r['seconds']:.1f}s ({phases}); peak RSS: Python driver "
            f"{gib(r['self_max_rss'])} GiB, its largest child (the JVM) "
            f"{gib(r['children_max_rss'])} GiB, the tree {gib(r['tree_peak_rss'])} GiB "
            f"(PSS {gib(r['tree_peak_pss'])}); CPU {r['cpu_seconds']:.1f} s ({cpu}); "
            f"process {r['process_seconds']:.1f}s"
            + (f", session start {r['session_start_seconds']:.1f}s" if name == "b" else ""),
            flush=True,
        )
    checked = measured("verify", directory, directory / "verify.log")
    tables = {k: v for k, v in checked.items() if k in ("a", "b")}
    fields = ("rows", "keys", "key_sum", "checksum", "batch_rows", "batch_offsets", "txns")
    for name, figures in tables.items():
        print(f"({name}) " + " ".join(f"{k}={figures[k]}" for k in (*fields, "files")))
        wanted = {
            "rows": meta["expected_rows"],
            "keys": meta["expected_rows"],
            "batch_rows": meta["expected_batch_rows"],
            "batch_offsets": meta["expected_batch_offset_sum"],
            "txns": meta["txns"],
        }
        wrong = {k: (figures[k], v) for k, v in wanted.items() if figures[k] != v}
        if wrong:
            raise SystemExit(f"({name}) does not hold what the data says: {wrong}")
    same = len(tables) < 2 or all(tables["a"][k] == tables["b"][k] for k in fields)
    if not same:
        raise SystemExit("the two results differ")
    if "a" in results and "b" in results:
        a, b = results["a"], results["b"]
        a_peak, b_peak = peak(a), peak(b)
        print(
            f"RESULT spark_vs_deltars_time={b['seconds'] / a['seconds']:.2f} "
            f"spark_vs_deltars_cpu={b['cpu_seconds'] / a['cpu_seconds']:.2f} "
            f"spark_vs_deltars_peak_rss={b_peak / a_peak:.2f} "
            f"identical={str(same).lower()} rows={meta['rows']} batch={meta['batch']}"
        )
    if args.keep:
        return
    if args.work is None:
        shutil.rmtree(work)
        return
    # The build stays cached under --work; the runs' tables go.
    for name in ("table", "result-a", "result-b"):
        shutil.rmtree(directory / name, ignore_errors=True)


if __name__ == "__main__":
    main()
