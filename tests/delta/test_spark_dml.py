"""Delta Spark's DML committing over an append that landed after it read its snapshot,
deterministically (no timing race): a Spark transaction is opened and reads the table's
files (``filterFiles``, as DELETE, UPDATE, MERGE and OPTIMIZE do), one append commits, then
the DML's actions (its rewritten file, the removes of the files it read) are committed
through that transaction. The append is either ours (delta-rs ``create_write_transaction``
with ``ingest.sink.txn.commit_properties``, as ``DeltaTarget`` commits) or Delta Spark's own
``df.write.format("delta").mode("append")``.

Delta Spark 4.4 OSS runs every data-changing commit under Serializable (its only accepted
``delta.isolationLevel``, the default): a concurrent append to an unpartitioned table
aborts DELETE, UPDATE and MERGE with DELTA_CONCURRENT_APPEND whoever wrote it, though
both appends say ``isBlindAppend: true``. OPTIMIZE changes no data (SnapshotIsolation) and
commits over either. docs/delta-compat.md, "Concurrent writers".
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction

from ingest.sink.txn import commit_properties, operation_metrics

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("offset", pa.int64()), ("n", pa.int64())])
DMLS = ("delete", "update", "merge", "optimize")
BOUND = 2  # DELETE drops the rows of offsets below it


def _rows(offsets: range) -> pa.Table:
    return pa.table({"offset": list(offsets), "n": list(offsets)}, schema=SCHEMA)


def _our_append(table: Path, offsets: range) -> None:
    """One append committed as ingest's sink commits (txn action, metrics, isBlindAppend)."""
    name = f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(_rows(offsets), table / name)
    stats = {"numRecords": len(offsets)}
    add = AddAction(
        name, (table / name).stat().st_size, {}, int(time.time() * 1000), True, json.dumps(stats)
    )
    target = DeltaTable(str(table))
    properties = commit_properties(uuid.uuid4().hex, {"ingest:test:0": offsets[-1]}, actions=[add])
    target.create_write_transaction([add], "append", target.schema(), commit_properties=properties)
    assert operation_metrics([add])["isBlindAppend"] is True


def _spark_append(spark: Any, table: Path, offsets: range) -> None:
    frame = spark.createDataFrame([(o, o) for o in offsets], "offset long, n long")
    frame.write.format("delta").mode("append").save(str(table))


def _scala_seq(spark: Any, items: list[Any]) -> Any:
    jvm = spark._jvm
    java_list = jvm.java.util.ArrayList()
    for item in items:
        java_list.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_list).toSeq()


def _operation(spark: Any, dml: str) -> Any:
    """The DeltaOperations value Spark's command of ``dml`` commits with."""
    jvm = spark._jvm
    ops = jvm.org.apache.spark.sql.delta
    none = jvm.scala.Option.apply(None)
    empty = _scala_seq(spark, [])
    if dml == "delete":
        return getattr(ops, "DeltaOperations$Delete")(empty)
    if dml == "update":
        return getattr(ops, "DeltaOperations$Update")(none)
    if dml == "merge":
        return getattr(ops, "DeltaOperations$Merge")(none, none, none, none, empty, empty, empty)
    return getattr(ops, "DeltaOperations$Optimize")(empty, empty, False, none, False)


def _rewritten(dml: str, read: pa.Table) -> pa.Table:
    """The rows the DML's new file holds, from the rows of the files it read."""
    if dml == "delete":
        return read.filter(pc.greater_equal(read.column("offset"), BOUND))
    if dml == "update":
        return read.set_column(1, "n", pc.negate(read.column("n")))
    if dml == "merge":  # matched rows updated, one source row inserted
        updated = read.set_column(1, "n", pc.negate(read.column("n")))
        return pa.concat_tables([updated, _rows(range(1000, 1001))])
    return read  # optimize: the same rows, compacted into one file


def _commit_over_append(spark: Any, table: Path, dml: str, append: str) -> tuple[str, int]:
    """Opens a Spark transaction, reads every file, lets ``append`` ("ours" or "spark")
    commit, then commits the DML's actions: ("committed", version) or (the error, the
    version the append landed at)."""
    jvm = spark._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table))
    txn = delta_log.startTransaction()
    files = txn.filterFiles()
    read_paths = [files.apply(i).path() for i in range(files.size())]
    data_change = dml != "optimize"
    now = int(time.time() * 1000)
    removes = [files.apply(i).removeWithTimestamp(now, data_change) for i in range(files.size())]
    read = pa.concat_tables([pq.read_table(table / p, schema=SCHEMA) for p in read_paths])

    if append == "ours":
        _our_append(table, range(100, 110))
    else:
        _spark_append(spark, table, range(100, 110))
    appended = DeltaTable(str(table)).version()

    name = f"part-{dml}-{uuid.uuid4().hex}.parquet"
    pq.write_table(_rewritten(dml, read), table / name)
    add = {
        "path": name,
        "partitionValues": {},
        "size": (table / name).stat().st_size,
        "modificationTime": now,
        "dataChange": data_change,
    }
    action = jvm.org.apache.spark.sql.delta.actions.Action.fromJson(json.dumps({"add": add}))
    try:
        version = txn.commit(_scala_seq(spark, [action, *removes]), _operation(spark, dml))
    except Exception as exc:
        return str(exc), appended
    return "committed", int(version)


@pytest.fixture
def no_history_metrics(spark: Any) -> Any:
    """The transaction is driven by hand: no SQL metrics were registered for its operation."""
    key = "spark.databricks.delta.history.metricsEnabled"
    spark.conf.set(key, "false")
    yield spark
    spark.conf.unset(key)


@pytest.mark.parametrize("dml", DMLS)
def test_spark_dml_treats_our_append_as_its_own(
    no_history_metrics: Any, tmp_path: Path, dml: str
) -> None:
    spark = no_history_metrics
    outcomes: dict[str, tuple[str, int]] = {}
    for append in ("ours", "spark"):
        table = tmp_path / append
        write_deltalake(str(table), _rows(range(0, 5)))
        _our_append(table, range(5, 10))  # two files for the DML to read
        outcomes[append] = _commit_over_append(spark, table, dml, append)
        # The append that landed during the DML is a blind append either way.
        log = table / "_delta_log" / f"{2:020d}.json"
        info = json.loads(log.read_text().splitlines()[0])["commitInfo"]
        assert info["isBlindAppend"] is True, info

    for append, (outcome, version) in outcomes.items():
        if dml == "optimize":
            # No data change: SnapshotIsolation, concurrent appends do not conflict.
            assert outcome == "committed", (append, outcome[:600])
            assert version == 3
            info = json.loads(
                (tmp_path / append / "_delta_log" / f"{3:020d}.json").read_text().splitlines()[0]
            )["commitInfo"]
            assert info["isolationLevel"] == "SnapshotIsolation", info
            rows = spark.read.format("delta").load(str(tmp_path / append))
            assert sorted(r.offset for r in rows.collect()) == [*range(10), *range(100, 110)]
        else:
            # Serializable: the append it should have read aborts it, ours as Spark's own.
            assert "DELTA_CONCURRENT_APPEND" in outcome, (append, outcome[:600])
            assert f"committed at version {version}" in outcome, (append, outcome[:600])
            assert version == 2
    assert _kind(outcomes["ours"][0]) == _kind(outcomes["spark"][0])


def _kind(outcome: str) -> str:
    """ "committed", or the error class Delta names (e.g. DELTA_CONCURRENT_APPEND...)."""
    found = re.search(r"\[(DELTA_[A-Z_.]+)\]", outcome)
    return found.group(1) if found else outcome[:200]
