"""The upsert's MERGE file by file (``ingest/sink/merging/streamed.py``) against delta-rs's
MERGE on the same batches: the same rows, and only the files holding a changed key are
rewritten. A merge planned on a snapshot whose files a rival removed is refused."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import RemoveAction

from ingest.errors import SinkError
from ingest.sink.delta import DeltaTarget
from ingest.sink.merging import merge as merge_module
from ingest.sink.merging.merge import upsert
from ingest.sink.merging.streamed import appended_since, merge_file_by_file, streamable
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN
from ingest.sink.txn import app_id

TOPIC = "t"


def _batch(changes: list[tuple[int, int, int, str | None, bool]]) -> pa.Table:
    """(key, partition, offset, value, delete) rows as a batch's staged rows; ``k2`` is a
    second key column (k mod 3)."""
    return pa.table(
        {
            "topic": pa.array([TOPIC] * len(changes), pa.string()),
            "partition": pa.array([c[1] for c in changes], pa.int32()),
            "offset": pa.array([c[2] for c in changes], pa.int64()),
            "k": pa.array([c[0] for c in changes], pa.int64()),
            "k2": pa.array([c[0] % 3 for c in changes], pa.int32()),
            "v": pa.array([c[3] for c in changes], pa.string()),
            DELETE_COLUMN: pa.array([c[4] for c in changes], pa.bool_()),
        }
    )


def _upsert(target: DeltaTarget, rows: pa.Table, group: str, keys: Sequence[str] = ("k",)) -> Any:
    app_of = lambda topic, partition: app_id(target.uri, group, topic, partition)  # noqa: E731
    txns: dict[str, int] = {}
    columns = rows.column("partition").to_pylist(), rows.column("offset").to_pylist()
    for p, o in zip(*columns, strict=True):
        app = app_of(TOPIC, p)
        txns[app] = max(txns.get(app, -1), o)
    return upsert(target, rows, merge_keys=list(keys), txns=txns, app_id_of=app_of)


def _held(uri: str) -> list[tuple[Any, ...]]:
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted((r["k"], r["partition"], r["offset"], r["v"]) for r in rows)


def _batches(seed: int) -> list[pa.Table]:
    """Changes of 60 keys over two partitions: updates, deletes, keys that move partition,
    and whole groups' replays of older offsets (another group: its txns do not cover
    them)."""
    rng = random.Random(seed)
    offsets = {0: 0, 1: 0}
    batches = []
    for _ in range(8):
        changes = []
        for _ in range(rng.randrange(20, 60)):
            partition = rng.randrange(2)
            offsets[partition] += 1
            value = None if rng.random() < 0.1 else f"v{rng.randrange(1000)}"
            changes.append((rng.randrange(60), partition, offsets[partition], value, False))
            if rng.random() < 0.15:
                changes[-1] = (*changes[-1][:3], None, True)
        batches.append(changes)
    return [_batch(c) for c in batches]


@pytest.mark.parametrize(
    ("seed", "keys"), [(1, ("k",)), (2, ("k",)), (3, ("k", "k2")), (4, ("partition", "k"))]
)
def test_file_by_file_merges_as_delta_rs_merges(
    tmp_path: Path, seed: int, keys: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    streamed = DeltaTarget(TableLocation.of(str(tmp_path / "streamed")))
    delta_rs = DeltaTarget(TableLocation.of(str(tmp_path / "delta_rs")))
    batches = _batches(seed)
    rng = random.Random(seed)
    for number, rows in enumerate(batches):
        # Sometimes another group replays an earlier batch: its older offsets change
        # nothing a later offset of the same partition wrote.
        groups = [("g", rows)]
        if number > 2 and rng.random() < 0.5:
            groups.append((f"other{number}", batches[rng.randrange(number)]))
        for group, replayed in groups:
            first = _upsert(streamed, replayed, group, keys)
            with monkeypatch.context() as patched:
                patched.setattr(merge_module, "streamable", lambda table, columns: False)
                second = _upsert(delta_rs, replayed, group, keys)
            assert _held(streamed.uri) == _held(delta_rs.uri), (number, group)
            assert (first.rows, first.deleted_rows) == (second.rows, second.deleted_rows)
    assert streamable(DeltaTable(streamed.uri), batches[0].column_names)
    assert len(_held(streamed.uri)) > 10  # the keys the last changes kept


def test_only_files_holding_a_changed_key_are_rewritten(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    _upsert(target, _batch([(k, 0, k, "a", False) for k in range(10)]), "g")
    (first,) = DeltaTable(location.uri).file_uris()
    _upsert(target, _batch([(k, 1, k, "b", False) for k in range(10, 20)]), "g")
    table = DeltaTable(location.uri)
    assert len(table.file_uris()) == 2
    merged = merge_file_by_file(
        location, table, _batch([(3, 0, 50, "c", False), (4, 0, 51, None, True)]), ["k"], 1
    )
    removes = [a for a in merged.actions if isinstance(a, RemoveAction)]
    assert [first.endswith(r.path) for r in removes] == [True]  # keys 3 and 4's file only
    assert (merged.inserted, merged.updated, merged.deleted) == (0, 1, 1)
    # An older change of partition 0 matches and does nothing (no insert, no remove).
    older = merge_file_by_file(location, table, _batch([(5, 0, 2, "old", False)]), ["k"], 1)
    assert older.actions == () and (older.inserted, older.updated) == (0, 0)
    # A file rewritten again and again keeps a name of the same length.
    names = []
    for offset in range(60, 64):
        _upsert(target, _batch([(offset - 60, 0, offset, "d", False)]), "g")
        names.append(max(len(p) for p in DeltaTable(location.uri).file_uris()))
    assert len(set(names)) == 1, names


def test_a_merge_planned_before_a_rival_removed_its_file_is_refused(tmp_path: Path) -> None:
    """delta-rs refuses the commit of a remove whose file a concurrent commit removed (no
    rewrite guard involved: the rival is delta-rs's own DELETE)."""
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    _upsert(target, _batch([(k, 0, k, "a", False) for k in range(10)]), "g")
    planned = DeltaTable(location.uri)
    merged = merge_file_by_file(location, planned, _batch([(1, 0, 20, "mine", False)]), ["k"], 1)
    DeltaTable(location.uri).delete("k = 2")  # rewrites the same file
    assert target.try_commit(planned, merged.actions, {"x": 1}, 1, "merge") is None
    # upsert itself merges again from the new snapshot: the change held, the delete kept.
    _upsert(target, _batch([(1, 0, 20, "mine", False)]), "g")
    held = {k: v for k, _, _, v in _held(location.uri)}
    assert held[1] == "mine" and 2 not in held and len(held) == 9


def test_a_table_column_the_batch_lacks_keeps_its_value(tmp_path: Path) -> None:
    """A MERGE's update keeps a column only the table has; a rewrite file by file would
    null it, so such a table is merged by delta-rs."""
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    first = _batch([(k, 0, k, "a", False) for k in range(4)])
    _upsert(target, first.append_column("extra", pa.array(["x"] * 4)), "g")
    assert not streamable(DeltaTable(location.uri), first.column_names)
    _upsert(target, _batch([(1, 0, 10, "b", False)]), "g")
    rows = {r["k"]: r for r in DeltaTable(location.uri).to_pyarrow_table().to_pylist()}
    assert (rows[1]["v"], rows[1]["extra"]) == ("b", "x")


def test_a_table_with_a_feature_is_not_merged_file_by_file(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    rows = _batch([(k, 0, k, "a", False) for k in range(4)])
    for properties in ({"delta.enableChangeDataFeed": "true"}, {"delta.appendOnly": "false"}):
        path = tmp_path / str(len(properties) + len(str(properties)))
        target = DeltaTarget(TableLocation.of(str(path)), properties=properties)
        _upsert(target, rows, "g")
        feed = "delta.enableChangeDataFeed" in properties
        assert streamable(DeltaTable(str(path)), rows.column_names) is not feed
    partitioned = DeltaTarget(location, partition_by=("k2",))
    _upsert(partitioned, rows, "g")
    assert not streamable(DeltaTable(location.uri), rows.column_names)


def test_a_failed_merge_deletes_what_it_wrote(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    _upsert(target, _batch([(k, 0, k, "a", False) for k in range(10)]), "g")
    _upsert(target, _batch([(k, 1, k, "b", False) for k in range(10, 20)]), "g")
    table = DeltaTable(location.uri)
    # The file read last (the log's order) is broken: the first one's remainder is written
    # by then (half its keys change).
    last = table.get_add_actions(flatten=False).column("path").to_pylist()[-1]
    (tmp_path / "t" / last).write_bytes(b"not parquet")
    before = sorted(p.name for p in (tmp_path / "t").glob("*.parquet"))
    changes = _batch([(k, 0, 30 + k, "c", False) for k in (0, 1, 2, 15)])
    with pytest.raises(SinkError, match="merging file by file failed"):
        merge_file_by_file(location, table, changes, ["k"], 1)
    assert sorted(p.name for p in (tmp_path / "t").glob("*.parquet")) == before


def test_rows_another_writer_appended_meanwhile_send_the_merge_round_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blind append after the merge's snapshot may hold a key the merge inserts, and
    delta-rs's checks let such a commit through: the merge starts again from the new
    snapshot, so the key is held once, with the later change."""
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    _upsert(target, _batch([(k, 0, k, "a", False) for k in range(4)]), "g")
    real = merge_module.merge_file_by_file
    calls = []

    def rival_first(*args: Any, **kwargs: Any) -> Any:
        if not calls:  # another writer appends key 7 once the merge has its snapshot
            write_deltalake(
                location.uri,
                _batch([(7, 1, 1, "rival", False)]).drop_columns([DELETE_COLUMN]),
                mode="append",
            )
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(merge_module, "merge_file_by_file", rival_first)
    outcome = _upsert(target, _batch([(7, 0, 10, "mine", False)]), "g")
    assert len(calls) == 2 and outcome.attempts == 2
    held = [(k, v) for k, _, _, v in _held(location.uri) if k == 7]
    assert held == [(7, "mine")]
    planned = DeltaTable(location.uri)
    assert not appended_since(location, planned)
