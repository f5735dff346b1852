"""``table.properties``: the Delta table properties of a table ingest creates, checked
before the first batch as the table they would make (delta-rs takes only the ``delta.*``
properties it knows; a feature ingest cannot honour for the table's mode is refused at
start, as on a table that exists)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.config import parse_config
from ingest.errors import ConfigError
from ingest.sink.metadata.features import UnsupportedTableFeature
from ingest.sink.metadata.probe_table import probe_properties
from ingest.supervisor.engine.maintainer import check_tables


def _config(tmp_path: Path, table: str) -> str:
    return f"""
[kafka]
bootstrap_servers = ["127.0.0.1:9092"]

[source]
topics = ["events"]
group_id = "g"

[table]
uri = "{tmp_path / "t"}"
{table}
"""


def test_a_property_delta_rs_does_not_know_is_refused_naming_it(tmp_path: Path) -> None:
    with (
        pytest.raises(ConfigError, match=r"Error parsing property 'myorg\.owner'"),
        probe_properties("/x", {"myorg.owner": "me"}),
    ):
        pass
    config = parse_config(
        _config(tmp_path, 'properties = { "delta.enableChangeDataFeed" = "true", "x.y" = "1" }'),
        path="conf/x.toml",
        env={},
    )
    with pytest.raises(ConfigError, match=r"table\.properties: .* 'x\.y'"):
        check_tables(config)
    assert not (tmp_path / "t").exists()


def test_properties_turning_on_a_feature_the_mode_cannot_honour_are_refused_at_start(
    tmp_path: Path,
) -> None:
    upsert = 'mode = "upsert"\nmerge_keys = ["k"]\nproperties = { "delta.appendOnly" = "true" }'
    config = parse_config(_config(tmp_path, upsert), path="conf/x.toml", env={})
    with pytest.raises(UnsupportedTableFeature, match="appendOnly"):
        check_tables(config)
    appending = parse_config(
        _config(tmp_path, 'properties = { "delta.appendOnly" = "true" }'),
        path="conf/x.toml",
        env={},
    )
    check_tables(appending)  # an append-only table takes appends
    assert not (tmp_path / "t").exists()


def test_the_txn_retention_property_is_refused_at_load(tmp_path: Path) -> None:
    text = _config(
        tmp_path, 'properties = { "delta.setTransactionRetentionDuration" = "interval 1 days" }'
    )
    with pytest.raises(ConfigError) as excinfo:
        parse_config(text, path="conf/x.toml", env={})
    assert str(excinfo.value) == (
        "conf/x.toml: table.properties: delta.setTransactionRetentionDuration would let the "
        "txn entries of quiet partitions expire, and exactly-once with them: leave it unset"
    )


def test_a_probe_is_the_table_the_properties_make() -> None:
    properties = {"delta.logRetentionDuration": "interval 9 days"}
    with probe_properties("/x", properties, ["day"]) as table:
        assert isinstance(table, DeltaTable)
        assert table.metadata().configuration == properties
        assert table.metadata().partition_columns == ["day"]
