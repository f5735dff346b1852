"""The table ingest would create with given properties, made empty in a temporary
directory, so that its features are checked (``features.check_table``) before the first
batch writes anything."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import DeltaError
from deltalake.transaction import create_table_with_add_actions

from ingest.errors import ConfigError

__all__ = ["probe_properties"]


@contextmanager
def probe_properties(
    uri: str, properties: Mapping[str, str], partition_by: Sequence[str] = ()
) -> Iterator[DeltaTable]:
    """The table ``uri`` would be when ingest creates it with ``properties``: created
    empty in a temporary directory for the ``with`` block, so that the caller can check
    its features before the first batch. ``ConfigError`` (key ``table.properties``) when
    delta-rs refuses a property: it takes only the ``delta.*`` properties it knows."""
    schema = pa.schema([pa.field(c, pa.string()) for c in (*partition_by, "offset")])
    with tempfile.TemporaryDirectory(prefix="ingest-probe-") as probe:
        try:
            create_table_with_add_actions(
                probe,
                Schema.from_arrow(schema),
                [],
                partition_by=list(partition_by) or None,
                configuration=dict(properties),
            )
        except DeltaError as exc:
            raise ConfigError(
                f"{uri}: delta-rs cannot create the table with these properties: {exc}",
                key="table.properties",
            ) from None
        yield DeltaTable(probe)
