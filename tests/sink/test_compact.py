"""Compaction (``ingest.sink.maintenance.compact``) beside the sink's other commits: no Spark, real
delta-rs tables on local disk, data files written as ingest's job writes them."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ingest.protocol.partition import Partition
from ingest.sink.delta import DeltaTarget
from ingest.sink.files import write_data_files
from ingest.sink.maintenance import rewrite
from ingest.sink.maintenance.compact import compact
from ingest.sink.overwrite import commit_replacing
from ingest.sink.storage import TableLocation
from ingest.sink.txn import REWRITE_GUARD, app_id
from tests.sink import committer
from tests.sink.test_replace import append, landed, offsets

MiB = 1024**2


def multiset(table: DeltaTable) -> Counter[tuple[object, ...]]:
    rows = table.to_pyarrow_table()
    names = sorted(rows.column_names)
    return Counter(zip(*(rows.column(n).to_pylist() for n in names), strict=True))


def rows_of(target: DeltaTarget, topic: str, partition: int, start: int, count: int) -> pa.Table:
    rows = committer.rows(partition, start, count)
    return rows.set_column(0, "topic", pa.array([topic] * count, pa.string()))


def test_delta_rs_optimize_lands_rows_twice_beside_another_compaction(tmp_path: Path) -> None:
    """Why ingest compacts with its own commit: delta-rs lets two OPTIMIZEs planned on one
    snapshot both commit (each removes the same files with dataChange=false), and drops
    the txn actions its commit properties would carry. If this fails, delta-rs changed."""
    target, _ = landed(tmp_path)
    first, second = DeltaTable(target.uri), DeltaTable(target.uri)
    first.optimize.compact()
    second.optimize.compact()
    table = DeltaTable(target.uri)
    assert len(offsets(table, 0)) == 600 and len(set(offsets(table, 0))) == 300


@pytest.mark.parametrize("partition_by", [(), ("partition",)])
def test_compaction_changes_no_row_and_no_txn(
    tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")), partition_by=partition_by)
    apps = {p: app_id(target.uri, "g", "race", p) for p in (0, 1)}
    for start in range(0, 200, 20):
        rows = pa.concat_tables([committer.rows(p, start, 20) for p in (0, 1)])
        files = write_data_files(rows, target.location, name=f"b{start}", partition_by=partition_by)
        target.commit_files(
            files,
            {apps[p]: start + 19 for p in (0, 1)},
            rows.schema,
            planned=target.versions(list(apps.values())),
            app_id_of=lambda t, p: apps[p],
        )
    before = DeltaTable(target.uri)
    files_before = len(before.file_uris())
    done = compact(target.location, target_size=MiB)
    after = DeltaTable(target.uri)
    assert done.version == before.version() + 1 == after.version()
    assert done.files_removed == files_before
    assert len(after.file_uris()) == done.files_added == (2 if partition_by else 1)
    assert multiset(after) == multiset(before)
    assert after.to_pyarrow_table().num_rows == 400
    for app in apps.values():
        assert after.transaction_version(app) == before.transaction_version(app) == 199
    actions = after.get_add_actions(flatten=True)
    assert pa.table(actions).column("num_records").to_pylist() == [400 // done.files_added] * (
        done.files_added
    )
    # Every action of the compaction's commit says it changes no data.
    log = (Path(target.uri) / "_delta_log" / f"{done.version:020d}.json").read_text()
    assert '"dataChange":true' not in log and log.count('"dataChange":false') == files_before + (
        done.files_added
    )
    # A second pass finds nothing to do.
    assert compact(target.location, target_size=MiB).version is None


def test_two_compactions_on_one_snapshot_land_nothing_twice(tmp_path: Path) -> None:
    target, _ = landed(tmp_path)
    first, second = DeltaTable(target.uri), DeltaTable(target.uri)
    before = multiset(first)
    won = compact(target.location, target_size=MiB, table=first)
    lost = compact(target.location, target_size=MiB, table=second)
    assert won.version is not None and lost.lost_race and lost.version is None
    table = DeltaTable(target.uri)
    assert multiset(table) == before
    assert table.transaction_version(REWRITE_GUARD) == 0
    # The loser deleted what it wrote: only the live file and the inputs are on disk.
    on_disk = {p.name for p in Path(target.uri).glob("*.parquet")}
    assert {n for n in on_disk if n.startswith("compact-")} == {
        Path(u).name for u in table.file_uris()
    }


def test_an_overwrite_cut_before_a_compaction_commits_never_doubles_rows(tmp_path: Path) -> None:
    """The overwrite's cut is planned on a snapshot, a compaction of the same files
    commits, then the overwrite tries its commit: the guard makes it lose, and
    commit_replacing cuts again from the compacted snapshot."""
    target, apps = landed(tmp_path)
    stale = DeltaTable(target.uri)  # not target.load(): the target brings that one up to date
    ranges = {Partition("race", 0): (150, 249)}
    removes, rewritten, replaced = rewrite.cut_ranges(target.location, stale, ranges, 1)
    assert replaced == 100
    assert compact(target.location, target_size=MiB).files_removed == 6
    actions = [*removes, *(f.add_action() for f in rewritten)]
    assert target.try_commit(stale, actions, {apps[0]: 299}, 1, "replacing", guarded=True) is None
    target.location.delete(f.path for f in rewritten)
    fresh = committer.rows(0, 150, 100)
    files = write_data_files(fresh, target.location, name="fresh")
    outcome = commit_replacing(target, files, {apps[0]: 249}, fresh.schema, ranges=ranges)
    assert outcome.dropped_rows == 100
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(300)) and offsets(table, 1) == list(range(300))
    assert table.transaction_version(apps[0]) == 299


def test_a_compaction_planned_before_an_overwrite_loses(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    stale = DeltaTable(target.uri)  # not target.load(): the target brings that one up to date
    fresh = committer.rows(1, 0, 50)
    files = write_data_files(fresh, target.location, name="fresh")
    commit_replacing(
        target, files, {apps[1]: 49}, fresh.schema, ranges={Partition("race", 1): (0, 49)}
    )
    assert compact(target.location, target_size=MiB, table=stale).lost_race
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(300)) and offsets(table, 1) == list(range(300))


def test_an_overwrite_after_a_compaction_is_exact_with_long_topic_names(tmp_path: Path) -> None:
    """Compacted files mix topics, partitions and batches; delta-rs truncates their string
    statistics (64 characters). The cut still finds every row of its range."""
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")))
    topics = ["t" * 247 + "-a", "t" * 247 + "-b"]  # Kafka's longest names
    apps = {(t, p): app_id(target.uri, "g", t, p) for t in topics for p in (0, 1)}
    for start in range(0, 100, 25):
        for topic in topics:
            rows = pa.concat_tables([rows_of(target, topic, p, start, 25) for p in (0, 1)])
            files = write_data_files(rows, target.location, name=f"{topic[-1]}{start}")
            target.commit_files(
                files,
                {apps[(topic, p)]: start + 24 for p in (0, 1)},
                rows.schema,
                planned=target.versions([apps[(topic, p)] for p in (0, 1)]),
                app_id_of=lambda t, p: apps[(t, p)],
            )
    assert compact(target.location, target_size=MiB).files_added == 1
    key = Partition(topics[1], 1)
    fresh = rows_of(target, topics[1], 1, 40, 30)
    fresh = fresh.set_column(4, "value", pa.array([b"new"] * 30, pa.binary()))
    files = write_data_files(fresh, target.location, name="fresh")
    outcome = commit_replacing(
        target, files, {apps[(topics[1], 1)]: 69}, fresh.schema, ranges={key: (40, 69)}
    )
    assert outcome.dropped_rows == 30
    rows = DeltaTable(target.uri).to_pyarrow_table()
    assert rows.num_rows == 400
    columns = [rows.column(c).to_pylist() for c in ("topic", "partition", "offset")]
    keys = Counter(zip(*columns, strict=True))
    assert set(keys.values()) == {1}
    new = rows.filter(pc.equal(rows.column("value"), b"new"))
    assert sorted(new.column("offset").to_pylist()) == list(range(40, 70))
    assert set(new.column("topic").to_pylist()) == {topics[1]}


def test_the_refilter_after_a_lost_race_stays_exact_after_a_compaction(tmp_path: Path) -> None:
    """A batch planned before a rival covered some of its offsets, with a compaction in
    between: the re-filter cuts the batch's own files by the txn versions, which the
    compaction never moves."""
    target, apps = landed(tmp_path)
    planned = target.versions([apps[0]])
    ours = committer.rows(0, 300, 100)
    files = write_data_files(ours, target.location, name="ours")
    append(target, apps, 0, 300, 60, "rival")  # covers 300-359
    assert compact(target.location, target_size=MiB).files_added == 1
    outcome = target.commit_files(
        files, {apps[0]: 399}, ours.schema, planned=planned, app_id_of=lambda t, p: apps[p]
    )
    assert outcome.dropped_rows == 60 and outcome.rows == 40
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(400))
    assert table.transaction_version(apps[0]) == 399


def test_compaction_beside_appends_changes_nothing(tmp_path: Path) -> None:
    """Appends (ingest's batches) and compactions race; every append lands once."""
    target, apps = landed(tmp_path)
    stop = threading.Event()
    passes: list[int] = []

    def keep() -> None:
        while not stop.is_set():
            passes.append(compact(target.location, target_size=MiB).files_removed)

    maintainer = threading.Thread(target=keep)
    maintainer.start()
    try:
        for start in range(300, 900, 20):
            for partition in (0, 1):
                append(target, apps, partition, start, 20, f"p{partition}-{start}")
    finally:
        stop.set()
        maintainer.join()
    assert sum(1 for removed in passes if removed) >= 3, passes
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(900)) and offsets(table, 1) == list(range(900))
    assert [table.transaction_version(a) for a in apps.values()] == [899, 899]


def test_a_compaction_planned_before_another_writer_deletes_loses(tmp_path: Path) -> None:
    """Another writer (here delta-rs's DELETE) removes, with dataChange=true, a file the
    compaction read: the compaction's remove of that file conflicts, so it never brings the
    deleted rows back. The next pass compacts the DELETE's file, whose Arrow schema says
    ``string_view``, with ours (plain ``string``)."""
    target, _ = landed(tmp_path)
    planned = target.load()
    assert planned is not None
    DeltaTable(target.uri).delete('"offset" < 10')
    expected = multiset(DeltaTable(target.uri))
    lost = compact(target.location, target_size=MiB, table=planned)
    assert lost.lost_race and lost.version is None
    assert multiset(DeltaTable(target.uri)) == expected
    assert compact(target.location, target_size=MiB).version is not None
    assert multiset(DeltaTable(target.uri)) == expected


def test_a_bin_is_compacted_one_row_group_at_a_time(tmp_path: Path) -> None:
    """A bin is streamed: a compaction of 48 MiB of Arrow rows holds a few row groups
    (here 1 MiB) of them at a time, not the bin (read whole before: 60 MiB here, and a
    soak's 180 MB bin took its supervisor to 2.9 GB). Measured in a fresh process, whose
    Arrow pool's peak is the compaction's alone; the rows come out the same, in order,
    over several row groups."""
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")))
    apps = {0: app_id(target.uri, "g", "big", 0)}
    value = b"x" * 1000
    for start in range(0, 48_000, 1_000):
        rows = committer.rows(0, start, 1_000)
        rows = rows.set_column(4, "value", pa.array([value] * 1_000, pa.binary()))
        files = write_data_files(rows, target.location, name=f"b{start}")
        target.commit_files(
            files,
            {apps[0]: start + 999},
            rows.schema,
            planned={apps[0]: None},
            app_id_of=lambda t, p: apps[0],
        )
    before = multiset(DeltaTable(target.uri))
    script = (
        "import sys, pyarrow as pa\n"
        "from ingest.sink import files\n"
        "from ingest.sink.maintenance.compact import compact\n"
        "from ingest.sink.storage import TableLocation\n"
        "files.ROW_GROUP_BYTES = 1024**2\n"
        "done = compact(TableLocation.of(sys.argv[1]), target_size=64 * 1024**2)\n"
        "print(done.files_removed, done.files_added, pa.default_memory_pool().max_memory())\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, target.uri], capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    removed, added, peak = map(int, ran.stdout.split())
    assert (removed, added) == (48, 1)
    assert peak < 12 * MiB, f"peak Arrow memory {peak / MiB:.1f} MiB for a 48 MiB bin"
    after = DeltaTable(target.uri)
    assert multiset(after) == before
    assert offsets(after, 0) == list(range(48_000))
    (path,) = after.file_uris()
    assert pq.ParquetFile(path).num_row_groups >= 20


def test_a_bin_whose_older_files_lack_a_column_is_compacted_with_nulls(tmp_path: Path) -> None:
    """Files written before a column was added are compacted with files that have it: the
    column comes out null for their rows, and the statistics count those nulls."""
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")))
    apps = {0: app_id(target.uri, "g", "evolve", 0)}
    for start in range(0, 100, 20):
        rows = committer.rows(0, start, 20)
        if start >= 60:
            rows = rows.append_column("added", pa.array(range(start, start + 20), pa.int64()))
        files = write_data_files(rows, target.location, name=f"b{start}")
        target.commit_files(
            files,
            {apps[0]: start + 19},
            rows.schema,
            planned=target.versions([apps[0]]),
            app_id_of=lambda t, p: apps[0],
        )
    before = multiset(DeltaTable(target.uri))
    done = compact(target.location, target_size=MiB)
    assert (done.files_removed, done.files_added, done.rows) == (5, 1, 100)
    after = DeltaTable(target.uri)
    assert multiset(after) == before
    added = after.to_pyarrow_table().sort_by("offset").column("added").to_pylist()
    assert added == [None] * 60 + list(range(60, 100))
    (stats,) = (
        pa.table(after.get_add_actions(flatten=True))
        .select(["null_count.added", "min.added", "max.added", "min.offset", "max.offset"])
        .to_pylist()
    )
    assert stats == {
        "null_count.added": 60,
        "min.added": 60,
        "max.added": 99,
        "min.offset": 0,
        "max.offset": 99,
    }


def test_a_file_of_half_the_target_or_more_is_not_compacted_again(tmp_path: Path) -> None:
    """A pass's output of half the target or more stays, even beside small files that sort
    before it (those that landed while the pass ran): in a 60-minute soak every pass rewrote
    every earlier output with them, 12M rows more each time (12M, 24M, 36M, 48M)."""
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")))
    apps = {0: app_id(target.uri, "g", "again", 0)}
    noise = np.random.default_rng(7)

    def land(start: int, count: int) -> None:
        rows = committer.rows(0, start, count)
        values = [noise.bytes(1000) for _ in range(count)]  # incompressible: sizes add up
        rows = rows.set_column(4, "value", pa.array(values, pa.binary()))
        files = write_data_files(rows, target.location, name=f"b{start}")
        target.commit_files(
            files,
            {apps[0]: start + count - 1},
            rows.schema,
            planned=target.versions([apps[0]]),
            app_id_of=lambda t, p: apps[0],
        )

    for start in range(0, 600, 100):  # six files of ~100 KB
        land(start, 100)
    first = compact(target.location, target_size=MiB)
    assert (first.files_removed, first.files_added) == (6, 1)
    (big,) = DeltaTable(target.uri).file_uris()
    for start in range(600, 800, 50):  # four of ~50 KB: with the big one, under the target
        land(start, 50)
    second = compact(target.location, target_size=MiB)
    assert (second.files_removed, second.files_added) == (4, 1)
    after = DeltaTable(target.uri)
    assert big in after.file_uris()
    assert offsets(after, 0) == list(range(800))
