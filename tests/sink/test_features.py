"""The feature table's decisions that need no Delta Spark (the rest: tests/delta/test_interop.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable, Field, Schema

from ingest.sink.metadata.features import (
    FEATURES,
    USES,
    UnsupportedTableFeature,
    active_features,
    check_table,
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
