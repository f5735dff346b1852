"""The feature table's decisions that need no Delta Spark (the rest: tests/delta/test_interop.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable, Field, Schema

from ingest.sink.inserts import checks_of
from ingest.sink.metadata.features import (
    FEATURES,
    USES,
    UnsupportedTableFeature,
    active_features,
    check_table,
    cut_writes_change_data,
    through_delta_spark,
)


def test_invariants_are_refused(tmp_path: Path) -> None:
    invariant = json.dumps({"expression": {"expression": "id > 0"}})
    schema = Schema([Field("id", "long", metadata={"delta.invariants": invariant})])
    table = DeltaTable.create(str(tmp_path / "t"), schema=schema)
    assert active_features(table) == {"invariants": "columns id"}
    for use in ("append", "upsert"):
        with pytest.raises(UnsupportedTableFeature, match="table feature 'invariants'"):
            check_table(str(tmp_path / "t"), table, use)  # type: ignore[arg-type]
    for use in ("compact", "overwrite"):
        check_table(str(tmp_path / "t"), table, use)  # type: ignore[arg-type]
    # With the Spark engine an append's rows are checked against it, then Delta Spark writes.
    check_table(str(tmp_path / "t"), table, "append", delta_spark=True)
    assert checks_of(table) == [("invariant of column id (id > 0)", "id > 0")]


def test_a_table_of_ingest_uses_no_feature(tmp_path: Path) -> None:
    table = DeltaTable.create(str(tmp_path / "t"), schema=Schema([Field("id", "long")]))
    assert active_features(table) == {}
    for use in USES:
        check_table(str(tmp_path / "t"), table, use)


def test_every_rule_names_a_test_and_every_refusal_a_reason() -> None:
    for name, rule in FEATURES.items():
        assert "::test_" in rule.test, name
        refused = not all(rule.allows(use) for use in USES)
        assert bool(rule.why) == refused, name


# Features refused for every use because delta-rs (1.6.6) refuses any write to a table that
# lists them: each table here is a hand-written log of the feature alone (reader features
# where the protocol makes it one), and a delta-rs append of one file must fail naming it.
# When an upgrade of delta-rs makes one of these pass, its rule can be revisited.
# (v2Checkpoint is not among them: delta-rs 1.6.6 appends to such a table.)
UPSTREAM_REFUSED = {
    "rowTracking": ("RowTracking", False),
    "domainMetadata": ("DomainMetadata", False),
    "inCommitTimestamp": ("InCommitTimestamp", False),
    "clustering": ("ClusteredTable", False),
    "typeWidening": ("TypeWidening", True),
    "vacuumProtocolCheck": ("VacuumProtocolCheck", True),
}


def hand_written_table(
    tmp_path: Path, feature: str, reader: bool, configuration: dict[str, str] | None = None
) -> DeltaTable:
    """A table whose protocol lists ``feature`` alone (a reader feature too with ``reader``),
    with ``configuration``."""
    log = tmp_path / "_delta_log"
    log.mkdir(parents=True)
    schema = {
        "type": "struct",
        "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
    }
    actions = [
        {"commitInfo": {"timestamp": 1795900000000, "operation": "CREATE TABLE"}},
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": [feature] if reader else [],
                "writerFeatures": [feature],
            }
        },
        {
            "metaData": {
                "id": "6f1c2a3e-0000-4000-8000-000000000003",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": configuration or {},
                "createdTime": 1795900000000,
            }
        },
    ]
    (log / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    return DeltaTable(str(tmp_path))


@pytest.mark.parametrize("feature", sorted(UPSTREAM_REFUSED))
def test_delta_rs_refuses_to_write_a_table_with_the_feature(tmp_path: Path, feature: str) -> None:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake.transaction import AddAction

    rust_name, reader = UPSTREAM_REFUSED[feature]
    table = hand_written_table(tmp_path, feature, reader)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64())}), tmp_path / "a.parquet")
    size = os.path.getsize(tmp_path / "a.parquet")
    with pytest.raises(Exception, match=rf"Unsupported table features required: \[.*{rust_name}"):
        table.create_write_transaction(
            [AddAction("a.parquet", size, {}, 1795900000000, True, None)], "append", table.schema()
        )
    assert FEATURES[feature].why and not any(FEATURES[feature].allows(u) for u in USES)


@pytest.mark.parametrize(
    "feature", ["rowTracking", "domainMetadata", "inCommitTimestamp", "clustering", "v2Checkpoint"]
)
def test_appends_to_such_a_table_go_through_delta_spark(tmp_path: Path, feature: str) -> None:
    table = hand_written_table(tmp_path, feature, reader=feature == "v2Checkpoint")
    assert through_delta_spark(table) == [feature]
    for use in ("append", "upsert", "overwrite"):
        check_table(str(tmp_path), table, use, delta_spark=True)  # type: ignore[arg-type]
        with pytest.raises(UnsupportedTableFeature, match="through Delta Spark's own transac"):
            check_table(str(tmp_path), table, use)  # type: ignore[arg-type]
    assert through_delta_spark(table, "overwrite") == [feature]
    # Compaction goes through Delta Spark's OPTIMIZE (maintain.py), not a batch's commit.
    with pytest.raises(UnsupportedTableFeature, match=f"table feature '{feature}'"):
        check_table(str(tmp_path), table, "compact", delta_spark=True)


def test_an_overwrite_of_a_change_feed_table_is_cut_by_delta_spark(tmp_path: Path) -> None:
    """delta-rs's commit takes no change data files: its cut would show every other row of
    the rewritten files deleted and inserted again in the feed. Delta Spark's DELETE writes
    change data files without deletion vectors, and then the replayed rows need theirs
    (``tests/delta/test_overwrite_delta_spark.py`` reads both feeds)."""
    feed = {"delta.enableChangeDataFeed": "true"}
    table = hand_written_table(tmp_path / "off", "changeDataFeed", reader=False, configuration=feed)
    for use in ("append", "upsert", "compact"):
        check_table(str(tmp_path), table, use)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedTableFeature, match=r"'changeDataFeed'.*no cdc action"):
        check_table(str(tmp_path), table, "overwrite")
    check_table(str(tmp_path), table, "overwrite", delta_spark=True)
    assert through_delta_spark(table, "overwrite") == ["changeDataFeed"]
    assert cut_writes_change_data(table)
    on = {**feed, "delta.enableDeletionVectors": "true"}
    table = hand_written_table(tmp_path / "on", "deletionVectors", reader=True, configuration=on)
    check_table(str(tmp_path), table, "overwrite", delta_spark=True)
    assert not cut_writes_change_data(table)
    unused = hand_written_table(tmp_path / "unused", "changeDataFeed", reader=False)
    assert not cut_writes_change_data(unused) and not through_delta_spark(unused, "overwrite")


def test_an_append_only_table_refuses_an_overwrite_up_front(tmp_path: Path) -> None:
    """An overwrite's cut removes files with rows in them, which delta.appendOnly forbids:
    delta-rs failed every attempt of such a commit ("no commit after N attempts")."""
    only = {"delta.appendOnly": "true"}
    table = hand_written_table(tmp_path, "appendOnly", reader=False, configuration=only)
    check_table(str(tmp_path), table, "append")
    for use in ("upsert", "overwrite"):
        with pytest.raises(UnsupportedTableFeature, match=r"'appendOnly'.*forbids removes"):
            check_table(str(tmp_path), table, use, delta_spark=True)  # type: ignore[arg-type]
