"""``merge.upsert_source``'s ``latest_only`` read (issue 38: the batch never whole in
memory) keeps what reading the batch whole and deduplicating it after the txn filter
keeps, whatever the txn versions, and splits off the same keyless rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.errors import ConfigError, SinkError
from ingest.sink.files import DataFile
from ingest.sink.merging.merge import latest_per_key, refilter_rows
from ingest.sink.merging.staged import upsert_source
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN

pytestmark = pytest.mark.quick

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("id", pa.int64()),
        ("region", pa.string()),
        ("value", pa.string()),
        (DELETE_COLUMN, pa.bool_()),
    ]
)


def _staged(tmp_path: Path, seed: int, files: int = 5, rows: int = 4000) -> list[DataFile]:
    """``files`` staged files of changes over few keys, two topics and three partitions,
    offsets of a partition spread over the files in no order, some keys null."""
    rng = np.random.default_rng(seed)
    total = files * rows
    topic = rng.choice(["a", "b"], total)
    partition = rng.integers(0, 3, total).astype(np.int32)
    offset = np.empty(total, np.int64)
    for t in ("a", "b"):
        for p in range(3):
            where = np.flatnonzero((topic == t) & (partition == p))
            offset[where] = rng.permutation(len(where))  # unique in the partition
    ids = rng.integers(0, 300, total)
    regions = rng.choice(["eu", "us", None], total)
    table = pa.table(
        {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "id": pa.array(ids, mask=rng.random(total) < 0.02),
            "region": pa.array(regions.tolist(), pa.string()),
            "value": [f"v{i}" for i in range(total)],
            DELETE_COLUMN: pa.array(rng.random(total) < 0.1, mask=rng.random(total) < 0.3),
        },
        schema=SCHEMA,
    )
    staged = []
    for i in range(files):
        path = f"_staging/part-{i}.parquet"
        (tmp_path / "_staging").mkdir(exist_ok=True)
        pq.write_table(table.slice(i * rows, rows), tmp_path / path, row_group_size=700)
        staged.append(DataFile(path, 0, (), rows, "", (), 0))
    return staged


def _sorted(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda r: (r["topic"], r["partition"], r["offset"]))


@pytest.mark.parametrize("keys", [["id"], ["id", "region"]])
@pytest.mark.parametrize("seed", [1, 2])
def test_latest_only_keeps_what_the_whole_read_keeps(
    tmp_path: Path, keys: list[str], seed: int
) -> None:
    location = TableLocation.of(str(tmp_path))
    files = _staged(tmp_path, seed)
    whole, whole_keyless = upsert_source(location, files, SCHEMA, keys, deletes=True)
    latest, keyless = upsert_source(location, files, SCHEMA, keys, deletes=True, latest_only=True)
    assert whole_keyless is not None and keyless is not None
    assert _sorted(keyless) == _sorted(whole_keyless)  # every keyless row, each once
    assert keyless.column(DELETE_COLUMN).null_count == 0
    assert latest.column(DELETE_COLUMN).null_count == 0
    assert latest.num_rows < whole.num_rows // 3  # the superseded changes are gone
    app = lambda topic, partition: f"{topic}-{partition}"  # noqa: E731
    for versions in ({}, {"a-0": 2000, "b-2": 10}, {"a-1": 10**6, "b-0": 1500}):
        expected = latest_per_key(refilter_rows(whole, versions, app), keys)
        got = latest_per_key(refilter_rows(latest, versions, app), keys)
        assert _sorted(got) == _sorted(expected)


def test_latest_only_of_no_files_and_unknown_keys(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path))
    rows, keyless = upsert_source(location, [], SCHEMA, ["id"], latest_only=True)
    assert rows.num_rows == 0 and keyless is None
    with pytest.raises(ConfigError, match="not columns of the batch"):
        upsert_source(location, [], SCHEMA, ["nope"], latest_only=True)


def test_latest_per_key_keeps_each_keys_highest_offset(tmp_path: Path) -> None:
    rows = pq.read_table(tmp_path / _staged(tmp_path, 3)[0].path)
    rows = rows.filter(rows.column("id").is_valid())
    expected: dict[int, dict[str, object]] = {}
    for row in rows.to_pylist():  # the reference: one row a key, by its offset, the later of a tie
        best = expected.get(row["id"])
        if best is None or row["offset"] >= best["offset"]:  # type: ignore[operator]
            expected[row["id"]] = row
    got = latest_per_key(rows, ["id"])
    assert _sorted(got) == _sorted(pa.Table.from_pylist(list(expected.values()), SCHEMA))
    distinct = pa.Table.from_pylist(list(expected.values()), SCHEMA)
    assert latest_per_key(distinct, ["id"]) is distinct  # no copy when keys are distinct


@pytest.mark.parametrize("latest_only", [False, True])
def test_files_of_one_batch_may_differ_in_their_columns(tmp_path: Path, latest_only: bool) -> None:
    """A task whose writer's schema added a column writes it, the batch's other files lack
    it (the batch's schema is the union): their rows read back with nulls there; a file
    without a merge key column gives dead letters."""
    files = _staged(tmp_path, 4, files=2, rows=100)
    schema = SCHEMA.append(pa.field("extra", pa.string()))
    later = pa.table(
        {
            "topic": ["a", "a"],
            "partition": pa.array([0, 0], pa.int32()),
            "offset": [10**6, 10**6 + 1],
            "id": [7, 8],
            "region": ["eu", "eu"],
            "value": ["x", "y"],
            DELETE_COLUMN: [False, False],
            "extra": ["e7", "e8"],
        },
        schema=schema,
    )
    pq.write_table(later, tmp_path / "_staging/extra.parquet")
    pq.write_table(later.drop_columns(["id"]), tmp_path / "_staging/keyless.parquet")
    files += [
        DataFile("_staging/extra.parquet", 0, (), 2, "", (), 0),
        DataFile("_staging/keyless.parquet", 0, (), 2, "", (), 0),
    ]
    location = TableLocation.of(str(tmp_path))
    rows, keyless = upsert_source(
        location, files, schema, ["id"], deletes=True, latest_only=latest_only
    )
    assert rows.schema == schema
    by_id = {r["id"]: r for r in latest_per_key(rows, ["id"]).to_pylist()}
    assert by_id[7]["extra"] == "e7" and by_id[8]["value"] == "y"  # the later file's
    assert {r["extra"] for i, r in by_id.items() if i not in (7, 8)} == {None}
    assert keyless is not None and keyless.schema == schema
    assert [r["extra"] for r in keyless.to_pylist() if r["extra"]] == ["e7", "e8"]


def test_rows_without_their_kafka_columns_are_refused(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path))
    schema = SCHEMA.remove(SCHEMA.get_field_index("offset"))
    with pytest.raises(SinkError, match="lack the columns"):
        upsert_source(location, [], schema, ["id"], latest_only=True)
