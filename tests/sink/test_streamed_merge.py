"""The upsert's MERGE file by file (``ingest/sink/merging/streamed.py``) against delta-rs's
MERGE on the same batches: the same rows, and only the files holding a changed key are
rewritten. A merge planned on a snapshot whose files a rival removed is refused."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from ingest.sink.delta import DeltaTarget
from ingest.sink.merging import merge as merge_module
from ingest.sink.merging.merge import upsert
from ingest.sink.merging.streamed import merge_file_by_file, streamable
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN
from ingest.sink.txn import app_id

TOPIC = "t"


def _batch(changes: list[tuple[int, int, int, str | None, bool]]) -> pa.Table:
    """(key, partition, offset, value, delete) rows as a batch's staged rows."""
    return pa.table(
        {
            "topic": pa.array([TOPIC] * len(changes), pa.string()),
            "partition": pa.array([c[1] for c in changes], pa.int32()),
            "offset": pa.array([c[2] for c in changes], pa.int64()),
            "k": pa.array([c[0] for c in changes], pa.int64()),
            "v": pa.array([c[3] for c in changes], pa.string()),
            DELETE_COLUMN: pa.array([c[4] for c in changes], pa.bool_()),
        }
    )


def _upsert(target: DeltaTarget, rows: pa.Table, group: str) -> Any:
    app_of = lambda topic, partition: app_id(target.uri, group, topic, partition)  # noqa: E731
    txns: dict[str, int] = {}
    columns = rows.column("partition").to_pylist(), rows.column("offset").to_pylist()
    for p, o in zip(*columns, strict=True):
        app = app_of(TOPIC, p)
        txns[app] = max(txns.get(app, -1), o)
    return upsert(target, rows, merge_keys=["k"], txns=txns, app_id_of=app_of)


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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_file_by_file_merges_as_delta_rs_merges(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
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
            first = _upsert(streamed, replayed, group)
            with monkeypatch.context() as patched:
                patched.setattr(merge_module, "streamable", lambda table: False)
                second = _upsert(delta_rs, replayed, group)
            assert _held(streamed.uri) == _held(delta_rs.uri), (number, group)
            assert (first.rows, first.deleted_rows) == (second.rows, second.deleted_rows)
    assert streamable(DeltaTable(streamed.uri))
    assert len(_held(streamed.uri)) > 10  # the keys the last changes kept


def test_only_files_holding_a_changed_key_are_rewritten(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    _upsert(target, _batch([(k, 0, k, "a", False) for k in range(10)]), "g")
    _upsert(target, _batch([(k, 1, k, "b", False) for k in range(10, 20)]), "g")
    before = set(DeltaTable(location.uri).file_uris())
    assert len(before) == 2
    table = DeltaTable(location.uri)
    merged = merge_file_by_file(
        location, table, _batch([(3, 0, 50, "c", False), (4, 0, 51, None, True)]), ["k"], 1
    )
    removes = [a for a in merged.actions if isinstance(a, RemoveAction)]
    assert len(removes) == 1 and removes[0].path in next(iter(before))  # the first file
    assert (merged.inserted, merged.updated, merged.deleted) == (0, 1, 1)
    # An older change of partition 0 matches and does nothing (no insert, no remove).
    older = merge_file_by_file(location, table, _batch([(5, 0, 2, "old", False)]), ["k"], 1)
    assert older.actions == () and (older.inserted, older.updated) == (0, 0)


def test_a_merge_planned_before_a_rival_removed_its_file_is_refused(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    target = DeltaTarget(location)
    _upsert(target, _batch([(k, 0, k, "a", False) for k in range(10)]), "g")
    planned = DeltaTable(location.uri)
    merged = merge_file_by_file(location, planned, _batch([(1, 0, 20, "mine", False)]), ["k"], 1)
    _upsert(target, _batch([(2, 0, 21, "rival", False)]), "g2")  # rewrites the same file
    assert target.try_commit(planned, merged.actions, {"x": 1}, 1, "merge", guarded=True) is None
    # upsert itself merges again from the new snapshot: both changes held.
    _upsert(target, _batch([(1, 0, 20, "mine", False)]), "g")
    held = {k: v for k, _, _, v in _held(location.uri)}
    assert (held[1], held[2]) == ("mine", "rival")
