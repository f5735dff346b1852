"""``overwrite.commit_replacing``: one transaction that swaps a range's rows (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.errors import SinkError
from ingest.sink.delta import DeltaTarget
from ingest.sink.files import write_data_files
from ingest.sink.maintenance import rewrite
from ingest.sink.overwrite import commit_replacing
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id
from ingest.sink.txnlog import txn_times
from tests.sink import committer


def append(
    target: DeltaTarget, apps: dict[int, str], partition: int, start: int, count: int, name: str
) -> None:
    """Offsets [start, start + count) of ``partition``, appended as ingest's job does."""
    rows = committer.rows(partition, start, count)
    files = write_data_files(rows, target.location, name=name)
    target.commit_files(
        files,
        {apps[partition]: start + count - 1},
        rows.schema,
        planned=target.versions([apps[partition]]),
        app_id_of=lambda t, p: apps[p],
    )


def landed(
    tmp_path: Path, properties: dict[str, str] | None = None
) -> tuple[DeltaTarget, dict[int, str]]:
    """Partitions 0 and 1, offsets 0-299 each, in files of 100 offsets."""
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")), properties=properties)
    apps = {p: app_id(target.uri, "g", "race", p) for p in (0, 1)}
    for start in (0, 100, 200):
        for partition in (0, 1):
            append(target, apps, partition, start, 100, f"p{partition}-{start}")
    return target, apps


def offsets(table: DeltaTable, partition: int) -> list[int]:
    rows = table.to_pyarrow_table(columns=["partition", "offset"])
    mine = rows.filter(pc.equal(rows.column("partition"), partition))
    return sorted(mine.column("offset").to_pylist())


def test_a_range_is_replaced_in_one_commit_rewriting_files_it_cuts(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    before = DeltaTable(target.uri)
    files_before = set(before.file_uris())
    # New rows for 150-249 of partition 0, marked so they can be told apart.
    fresh = committer.rows(0, 150, 100)
    fresh = fresh.set_column(
        fresh.schema.get_field_index("value"), "value", pa.array([b"new"] * 100, pa.binary())
    )
    files = write_data_files(fresh, target.location, name="fresh")
    outcome = commit_replacing(
        target, files, {apps[0]: 249}, fresh.schema, ranges={("race", 0): (150, 249)}
    )
    assert outcome.committed and outcome.dropped_rows == 100 and outcome.rows == 100
    table = DeltaTable(target.uri)
    assert table.version() == before.version() + 1  # one transaction
    assert offsets(table, 0) == list(range(300)) and offsets(table, 1) == list(range(300))
    rows = table.to_pyarrow_table(columns=["partition", "offset", "value"])
    new = rows.filter(pc.equal(rows.column("value"), b"new"))
    assert sorted(new.column("offset").to_pylist()) == list(range(150, 250))
    assert set(new.column("partition").to_pylist()) == {0}
    # The txn never moves back: the table still covers partition 0 through 299.
    assert table.transaction_version(apps[0]) == 299
    assert table.transaction_version(apps[1]) == 299
    # The two files the range cut were replaced; partition 1's were not touched.
    files_after = set(table.file_uris())
    gone = files_before - files_after
    assert len(gone) == 2 and all("p0-" in f for f in gone)
    operations = [h["operation"] for h in table.history(limit=1)]
    assert operations == ["WRITE"]


def test_replacing_is_idempotent_and_extends_past_the_txn_version(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    rows = committer.rows(1, 250, 100)  # 250-349: the table holds up to 299
    for attempt in range(2):
        files = write_data_files(rows, target.location, name=f"again-{attempt}")
        outcome = commit_replacing(
            target, files, {apps[1]: 349}, rows.schema, ranges={("race", 1): (250, 349)}
        )
        assert outcome.dropped_rows == (50 if attempt == 0 else 100)
        table = DeltaTable(target.uri)
        assert offsets(table, 1) == list(range(350))
        assert table.transaction_version(apps[1]) == 349


def test_a_concurrent_commit_is_redone_against_the_new_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rival lands rows of the range between our read and our commit: the first
    attempt loses, the retry takes the rival's rows out too (no duplicates)."""
    target, apps = landed(tmp_path)
    rival = DeltaTarget(target.location)
    real_cut = rewrite.cut_ranges
    calls = {"n": 0}

    def cut_then_rival_commits(location, table, ranges, attempt, mapping):  # type: ignore[no-untyped-def]
        cut = real_cut(location, table, ranges, attempt, mapping)
        calls["n"] += 1
        if calls["n"] == 1:
            append(rival, apps, 0, 300, 50, "rival")  # 300-349, inside the range replaced
        return cut

    monkeypatch.setattr(rewrite, "cut_ranges", cut_then_rival_commits)
    rows = committer.rows(0, 250, 100)
    files = write_data_files(rows, target.location, name="mine")
    outcome = commit_replacing(
        target, files, {apps[0]: 349}, rows.schema, ranges={("race", 0): (250, 349)}
    )
    assert outcome.attempts == 2 and calls["n"] == 2
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(350))
    assert table.transaction_version(apps[0]) == 349
    # The first attempt's rewritten file (p0-200 without 250-299) was deleted, not
    # orphaned; the second attempt's is in the table. (Removed files stay until VACUUM.)
    on_disk = {p.name for p in (tmp_path / "t").glob("*.parquet")}
    assert not [name for name in on_disk if name.startswith("r1-")]
    assert [Path(f).name for f in table.file_uris() if Path(f).name.startswith("r2-")]


def test_a_table_without_offset_columns_cannot_be_replaced(tmp_path: Path) -> None:
    uri = str(tmp_path / "plain")
    write_deltalake(uri, pa.table({"id": [1, 2]}))
    target = DeltaTarget(TableLocation.of(uri))
    rows = committer.rows(0, 0, 1)
    with pytest.raises(SinkError, match="lacks"):
        commit_replacing(target, [], {"app": 0}, rows.schema, ranges={("race", 0): (0, 0)})


def test_txn_times_come_from_the_log_and_from_a_checkpoint(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    times = txn_times(target.location, [apps[0], apps[1], "ingest:nobody"])
    assert times["ingest:nobody"] is None
    history = DeltaTable(target.uri).history()
    stamps = [h["timestamp"] for h in history]
    for app in (apps[0], apps[1]):
        stamp = times[app]
        assert stamp is not None and min(stamps) - 5000 <= stamp <= max(stamps) + 5000
    # Partition 1 lands after partition 0 in every round of `landed`.
    assert times[apps[1]] >= times[apps[0]]  # type: ignore[operator]
    # After a checkpoint, an app id with no later commit is read from the checkpoint.
    DeltaTable(target.uri).create_checkpoint()
    append(target, apps, 0, 300, 10, "later")
    again = txn_times(target.location, [apps[0], apps[1]])
    assert again[apps[1]] == times[apps[1]]
    assert again[apps[0]] is not None and again[apps[0]] >= times[apps[1]]  # type: ignore[operator]


def test_a_table_partitioned_by_the_kafka_partition_is_cut_by_its_partition_values(
    tmp_path: Path,
) -> None:
    """A partition column is not in its files: the cut reads it from the file's partition
    value (it raised KeyError 'partition' before)."""
    target = DeltaTarget(TableLocation.of(str(tmp_path / "t")), partition_by=("partition",))
    apps = {p: app_id(target.uri, "g", "race", p) for p in (0, 1)}
    for partition in (0, 1):
        rows = committer.rows(partition, 0, 100)
        files = write_data_files(
            rows, target.location, name=f"p{partition}", partition_by=["partition"]
        )
        target.commit_files(
            files,
            {apps[partition]: 99},
            rows.schema,
            planned=target.versions([apps[partition]]),
            app_id_of=lambda t, p: apps[p],
        )
    fresh = committer.rows(0, 50, 100)
    files = write_data_files(fresh, target.location, name="fresh", partition_by=["partition"])
    outcome = commit_replacing(
        target, files, {apps[0]: 149}, fresh.schema, ranges={("race", 0): (50, 149)}
    )
    assert outcome.dropped_rows == 50
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(150)) and offsets(table, 1) == list(range(100))
