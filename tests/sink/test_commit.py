"""Driver-side commits without Spark: txn app ids, data files, schema evolution, races."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ingest.errors import ConfigError, SinkError
from ingest.sink.delta import DeltaTarget
from ingest.sink.files import DataFile, delta_stats, write_data_files
from ingest.sink.maintenance.rewrite import StaleBatchError
from ingest.sink.storage import TableLocation, normalize_uri
from ingest.sink.table_config import TableConfig
from ingest.sink.txn import app_id
from tests.sink import committer


def test_app_id_follows_its_documented_derivation(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    identity = json.dumps([uri, "group", "events", 3]).encode()
    expected = "ingest:events:3:" + hashlib.sha256(identity).hexdigest()[:24]
    assert app_id(uri, "group", "events", 3) == expected
    # Spellings of one table agree; other tables, groups and partitions do not.
    assert app_id(uri + "/", "group", "events", 3) == expected
    # Hadoop's file:/x (what a catalog gives) and file:///x are the path /x.
    assert app_id(f"file:{uri}", "group", "events", 3) == expected
    assert app_id(f"file://{uri}/", "group", "events", 3) == expected
    assert app_id(f"file://{uri}", "group", "events", 3) == expected
    assert app_id("s3a://b/t/", "g", "e", 0) == app_id("s3://b/t", "g", "e", 0)
    others = {
        app_id(uri + "x", "group", "events", 3),
        app_id(uri, "group2", "events", 3),
        app_id(uri, "group", "events2", 3),
        app_id(uri, "group", "events", 4),
    }
    assert expected not in others and len(others) == 4
    assert normalize_uri("relative/t") == os.path.abspath("relative/t")


def test_table_config_refuses_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="merge_keys"):
        TableConfig(uri="/t", group="g", mode="upsert")
    with pytest.raises(ConfigError, match=r"table\.value\.schema"):
        TableConfig(uri="/t", group="g", value_format="json")
    with pytest.raises(ConfigError, match=r"table\.value\.format"):
        TableConfig(uri="/t", group="g", value_format="xml")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="schema registry"):
        TableConfig(uri="/t", group="g", value_format="avro")
    config = TableConfig(
        uri="s3://b/t/", group="g", storage_options={"AWS_SECRET_ACCESS_KEY": "hunter2"}
    )
    assert config.dead_letters == "s3://b/t_dead_letters"
    assert config.dead_letter_options == {"AWS_SECRET_ACCESS_KEY": "hunter2"}
    assert "hunter2" not in repr(config)


def _rows(partition: int, start: int, count: int, **extra: pa.Array) -> pa.Table:
    table = committer.rows(partition, start, count)
    for name, column in extra.items():
        table = table.append_column(name, column)
    return table


def _commit(target: DeltaTarget, files: list[DataFile], txns: dict[str, int], schema: pa.Schema):  # type: ignore[no-untyped-def]
    planned = target.versions(list(txns))
    return target.commit_files(
        files,
        txns,
        schema,
        planned=planned,
        app_id_of=lambda t, p: app_id(target.uri, "g", t, p),
    )


def test_files_commit_with_txn_actions_and_read_back(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    app = app_id(location.uri, "g", "race", 0)
    first = _rows(0, 0, 100)
    files = write_data_files(first, location, name="a")
    outcome = _commit(target, files, {app: 99}, first.schema)
    # Version 0 is the empty create; the data is the first commit after it.
    assert outcome.committed and outcome.version == 1 and outcome.rows == 100
    assert [(s.partition, s.min_offset, s.max_offset) for s in files[0].sources] == [(0, 0, 99)]
    table = DeltaTable(location.uri)
    assert table.transaction_version(app) == 99
    back = table.to_pyarrow_table().sort_by("offset")
    assert back.equals(first.cast(back.schema))
    # An empty batch that still moves the partition on: a commit with the txn alone.
    outcome = _commit(target, [], {app: 150}, first.schema)
    assert outcome.committed and outcome.version == 2 and outcome.files == ()
    assert DeltaTable(location.uri).transaction_version(app) == 150
    # A txn never moves back, and a batch already covered commits nothing.
    outcome = _commit(target, [], {app: 120}, first.schema)
    assert not outcome.committed and outcome.txn_versions[app] == 150
    assert DeltaTable(location.uri).version() == 2


def test_a_missing_or_truncated_file_is_refused_before_committing(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    rows = _rows(0, 0, 10)
    [data_file] = write_data_files(rows, location, name="a")
    os.truncate(tmp_path / "t" / data_file.path, 10)
    with pytest.raises(SinkError, match="not as written"):
        _commit(target, [data_file], {"app": 9}, rows.schema)
    assert target.load() is None


def test_partition_values_and_stats_survive_delta_rs_and_odd_values(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location, partition_by=("day", "label"))
    count = 6
    rows = _rows(
        0,
        0,
        count,
        day=pa.array([dt.date(2024, 1, 1)] * 3 + [dt.date(2024, 1, 2)] * 3, pa.date32()),
        label=pa.array(["a b/c%d=é", None, "plain", "a b/c%d=é", None, "plain"]),
    )
    files = write_data_files(rows, location, name="p", partition_by=("day", "label"))
    assert len(files) == 6
    assert {dict(f.partition_values)["label"] for f in files} == {"a b/c%d=é", None, "plain"}
    outcome = _commit(target, files, {"app": 5}, rows.schema)
    assert outcome.committed
    back = DeltaTable(location.uri).to_pyarrow_table().sort_by("offset")
    assert back.column("label").to_pylist() == rows.column("label").to_pylist()
    assert back.column("day").to_pylist() == rows.column("day").to_pylist()
    # Stats: exact integer bounds, timestamps widened to whole milliseconds.
    stamps = pa.array(
        [dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=dt.UTC), None], pa.timestamp("us", "UTC")
    )
    stats = json.loads(delta_stats(pa.table({"o": pa.array([7, 3]), "ts": stamps})))
    assert stats == {
        "numRecords": 2,
        "minValues": {"o": 3, "ts": "2024-01-01T00:00:00.001Z"},
        "maxValues": {"o": 7, "ts": "2024-01-01T00:00:00.002Z"},
        "nullCount": {"o": 0, "ts": 1},
    }


def test_schema_evolves_with_new_nullable_columns_and_refuses_type_changes(
    tmp_path: Path,
) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    first = _rows(0, 0, 5)
    _commit(target, write_data_files(first, location, name="a"), {"app": 4}, first.schema)
    wider = _rows(0, 5, 5, note=pa.array(["n"] * 5))
    outcome = _commit(target, write_data_files(wider, location, name="b"), {"app": 9}, wider.schema)
    assert outcome.committed
    back = DeltaTable(location.uri).to_pyarrow_table().sort_by("offset")
    assert back.column("note").to_pylist() == [None] * 5 + ["n"] * 5
    clashing = _rows(0, 10, 5).set_column(2, "offset", pa.array([str(i) for i in range(5)]))
    clashing = clashing.append_column("note", pa.array([1, 2, 3, 4, 5], pa.int64()))
    files = write_data_files(clashing, location, name="c")
    with pytest.raises(SinkError, match=r"offset \(table \"long\", batch \"string\"\); note"):
        _commit(target, files, {"app": 14}, clashing.schema)
    # The refused batch's files are gone; the table is as it was.
    assert not (tmp_path / "t" / files[0].path).exists()
    assert DeltaTable(location.uri).to_pyarrow_table().num_rows == 10


def test_two_processes_racing_for_the_same_offsets_land_each_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "race")
    rounds = 6
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [
        context.Process(target=committer.commit_rounds, args=(uri, me, rounds, barrier, results))
        for me in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    reports = [results.get(timeout=5) for _ in range(2 * rounds)]
    table = DeltaTable(uri)
    rows = table.to_pyarrow_table()
    by_partition = {
        partition: sorted(
            offset
            for p, offset in zip(
                rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True
            )
            if p == partition
        )
        for partition in (0, 10, 11)
    }
    expected = list(range(rounds * committer.ROWS_PER_ROUND))
    # The shared partition holds each offset once; each process's own partition all of its own.
    assert by_partition == {0: expected, 10: expected, 11: expected}
    last = rounds * committer.ROWS_PER_ROUND - 1
    for partition in (0, 10, 11):
        assert table.transaction_version(app_id(uri, committer.GROUP, "race", partition)) == last
    # Every round had a loser on the shared partition, and it left no file behind.
    assert sum(dropped for _, _, _, dropped, _ in reports) == rounds * committer.ROWS_PER_ROUND
    on_disk = {str(p) for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts}
    assert on_disk == set(table.file_uris())


def test_two_writers_creating_a_table_at_once_land_each_offset_once(tmp_path: Path) -> None:
    # delta-rs rebases a losing *create* onto the winner without checking txn actions, so
    # both creates succeed (seen in 9 of 15 raw trials); data must never ride in a create.
    trials = 12
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [
        context.Process(
            target=committer.first_commit_trials, args=(str(tmp_path), me, trials, barrier, results)
        )
        for me in range(2)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    outcomes = [results.get(timeout=5) for _ in range(2 * trials)]
    for trial in range(trials):
        uri = str(tmp_path / f"t{trial}")
        offsets = sorted(DeltaTable(uri).to_pyarrow_table().column("offset").to_pylist())
        assert offsets == list(range(committer.ROWS_PER_ROUND)), f"trial {trial}"
        winners = [me for me, t, committed in outcomes if t == trial and committed]
        assert len(winners) == 1, f"trial {trial}: committed by {winners}"
        on_disk = {str(p) for p in Path(uri).rglob("*.parquet")}
        assert on_disk == set(DeltaTable(uri).file_uris()), f"trial {trial}: orphaned files"
        # One table, created once with the properties of the one that created it.
        configuration = DeltaTable(uri).metadata().configuration
        assert configuration["delta.logRetentionDuration"] in (
            "interval 60 days",
            "interval 61 days",
        )
        creates = [h for h in DeltaTable(uri).history() if h.get("operation") == "CREATE TABLE"]
        assert len(creates) == 1, f"trial {trial}: {creates}"


def test_a_file_written_outside_describes_itself_in_its_footer(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    [written] = write_data_files(_rows(2, 40, 10), location, name="x")
    footer = pq.read_metadata(tmp_path / "t" / written.path).metadata[b"ingest.datafile"]
    described = DataFile.from_json(footer)
    assert described.sources == written.sources and described.rows == 10
    assert described.stats == written.stats


def test_a_file_without_provenance_cannot_be_refiltered_and_is_removed(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    app = app_id(location.uri, "g", "race", 0)
    planned = target.versions([app])
    # A transform's output without the Kafka columns, planned before a rival's commit.
    shaped = pa.table({"user": ["a", "b"]})
    [blind] = write_data_files(shaped, location, name="blind")
    assert blind.sources == ()
    rival = _rows(0, 0, 10)
    _commit(target, write_data_files(rival, location, name="rival"), {app: 9}, rival.schema)
    with pytest.raises(StaleBatchError, match="does not say which offsets"):
        target.commit_files(
            [blind], {app: 9}, shaped.schema, planned=planned, app_id_of=lambda t, p: app
        )
    assert not (tmp_path / "t" / blind.path).exists()
    assert DeltaTable(location.uri).version() == 1  # create + the rival; nothing of ours


def test_a_created_table_is_checkpointed_every_10_versions_by_its_commits(
    tmp_path: Path,
) -> None:
    # Each batch loads the table from its last checkpoint: the commit files after it are
    # read one by one (on delta-rs's threads), so they must stay few (Delta Spark's 10).
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    app = app_id(location.uri, "g", "cp", 0)
    for batch in range(12):
        rows = _rows(0, batch * 10, 10)
        _commit(
            target,
            write_data_files(rows, location, name=f"b{batch}"),
            {app: batch * 10 + 9},
            rows.schema,
        )
    table = DeltaTable(location.uri)
    assert table.version() == 12
    assert table.metadata().configuration["delta.checkpointInterval"] == "10"
    log = tmp_path / "t" / "_delta_log"
    # delta-rs checkpoints the version whose number + 1 is a multiple of the interval.
    assert (log / f"{9:020d}.checkpoint.parquet").exists(), sorted(p.name for p in log.iterdir())
    # A table's own setting wins.
    other = TableLocation.of(str(tmp_path / "u"))
    assert DeltaTarget(other, properties={"delta.checkpointInterval": "50"}).properties == {
        "delta.checkpointInterval": "50"
    }


def test_a_landing_hands_its_snapshot_to_the_next_unless_the_table_was_made_again(
    tmp_path: Path,
) -> None:
    """The next target of a table takes the snapshot the last one released and reads only
    the commits made since (another writer's too); a table deleted and created again at
    the same URI is loaded afresh, never read as the old one's continuation."""
    location = TableLocation.of(str(tmp_path / "t"))
    first = DeltaTarget(location)
    rows = _rows(0, 0, 10)
    _commit(first, write_data_files(rows, location, name="a"), {"a": 9}, rows.schema)
    held = first.load()
    other = DeltaTarget(location)  # another writer, with a snapshot of its own
    _commit(other, write_data_files(_rows(1, 0, 5), location, name="b"), {"b": 4}, rows.schema)
    first.release()
    second = DeltaTarget(location)
    table = second.load()
    assert table is held and table is not None
    assert table.version() == DeltaTable(location.uri).version()
    assert table.to_pyarrow_table().num_rows == 15
    assert second.versions(["a", "b"]) == {"a": 9, "b": 4}
    # The table is dropped and made again, with one commit more than the kept snapshot's
    # version (whose commit file is now another): a continuation would be read wrongly.
    second.release()
    shutil.rmtree(tmp_path / "t")
    again = DeltaTarget(location)
    for number in range(4):
        part = _rows(2, number * 3, 3)
        files = write_data_files(part, location, name=f"c{number}")
        again.commit_files(
            files,
            {"c": number * 3 + 2},
            part.schema,
            planned={"c": None if number == 0 else number * 3 - 1},
            app_id_of=lambda t, p: "c",
        )
    again.release()
    fresh = DeltaTarget(location).load()
    assert fresh is not None and fresh is not held
    assert fresh.to_pyarrow_table().num_rows == 12
    assert DeltaTarget(location).versions(["a", "b", "c"]) == {"a": None, "b": None, "c": 11}
