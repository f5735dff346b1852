"""Schema evolution of a Delta table: additive only.

A batch may bring columns the table lacks (a writer's schema with new fields, a
wider JSON schema, a changed transform): they are added as nullable columns in the
batch's own commit, next to its files and txn actions (``widening``), so no reader sees
the rows without their columns or the columns without their rows. delta-rs' transaction
API writes a ``metaData`` action only with mode "overwrite"; its partition filter there
says which files the commit removes, and ``c IN ()`` matches none, so the commit removes
nothing (it shows as a WRITE with mode Overwrite and no remove in the table's history).
A table with column mapping takes its new columns in commits of their own before the
batch's (``evolve``: each field, nested ones too, gets an id above the table's
``maxColumnId`` and a physical name, as Delta Spark gives them). A column whose type differs is refused with ``SinkError`` naming
every such column, table type and batch type. Every column is nullable in the
table: older rows lack new columns, and Delta's NOT NULL would be an invariant
the files written here do not promise.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, Field, Schema

from ingest.errors import SinkError
from ingest.sink.metadata.mapping import MAX_COLUMN_ID, ColumnMapping, mapped_fields, max_column_id

__all__ = ["Widening", "evolve", "mapping_of", "nullable_schema", "schema_changes", "widening"]

log = logging.getLogger("ingest.sink")


def _without_metadata(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_metadata(v) for k, v in value.items() if k != "metadata"}
    if isinstance(value, list):
        return [_without_metadata(v) for v in value]
    return value


def _type_json(delta_field: Field) -> object:
    """A column's type, without the metadata of nested fields (a table with column
    mapping gives each its physical name and id; a batch's have none)."""
    return _without_metadata(json.loads(delta_field.to_json())["type"])


def schema_changes(table_schema: Schema, batch_schema: pa.Schema) -> list[Field]:
    """The columns a batch adds to a table; raises ``SinkError`` naming every column
    whose type differs (only nullable top-level additions are evolved)."""
    existing = {f.name: f for f in table_schema.fields}
    incoming = Schema.from_arrow(batch_schema).fields
    clashes = [
        f"{f.name} (table {json.dumps(_type_json(existing[f.name]))}, "
        f"batch {json.dumps(_type_json(f))})"
        for f in incoming
        if f.name in existing and _type_json(f) != _type_json(existing[f.name])
    ]
    if clashes:
        raise SinkError(
            "the batch's schema is incompatible with the table's; columns: " + "; ".join(clashes)
        )
    return [Field(f.name, f.type, nullable=True) for f in incoming if f.name not in existing]


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """Every top-level column nullable (see the module docstring)."""
    return pa.schema([f.with_nullable(True) for f in schema], metadata=None)


def evolve(uri: str, table: DeltaTable, schema: pa.Schema) -> bool:
    """Adds the batch's new columns to ``table`` (at ``uri``; a commit of its own),
    and says whether it did. A concurrent commit makes it raise delta-rs'
    ``CommitFailedError``."""
    added = schema_changes(table.schema(), schema)
    if not added:
        return False
    log.info("%s: adding columns %s", uri, [f.name for f in added])
    if mapping_of(table) is None:
        table.alter.add_columns(added)
        return True
    # delta-rs's ALTER refuses a table with column mapping ("Column mapping is not supported
    # for write operation 'ADD COLUMN'"): the ids and physical names are given here, the
    # table's maxColumnId raised first (raise_if_not_exists=False: delta-rs's property
    # check does not know the key), then the schema written by a commit that removes nothing.
    configuration = table.metadata().configuration
    fields, last = mapped_fields(
        [json.loads(f.to_json()) for f in added],
        max_column_id(table.schema().to_json(), configuration),
    )
    table.alter.set_table_properties({MAX_COLUMN_ID: str(last)}, raise_if_not_exists=False)
    how = widening(table, [Field.from_json(json.dumps(f)) for f in fields])
    table.create_write_transaction(
        [],
        how.mode,
        how.schema,
        partition_by=list(table.metadata().partition_columns) or None,
        partition_filters=how.partition_filters,
    )
    return True


@dataclass(frozen=True)
class Widening:
    """How a commit that adds columns is asked of ``create_write_transaction``."""

    mode: str
    schema: Schema
    partition_filters: list[tuple[str, str, Any]] | None


def widening(table: DeltaTable, added: list[Field]) -> Widening:
    """The commit arguments that add ``added`` to ``table``'s schema and remove no file
    (``added`` empty: a plain append)."""
    schema = table.schema()
    if not added:
        return Widening("append", schema, None)
    first = (table.metadata().partition_columns or [schema.fields[0].name])[0]
    return Widening("overwrite", Schema([*schema.fields, *added]), [(first, "in", [])])


def mapping_of(table: DeltaTable | None) -> ColumnMapping | None:
    """The column mapping of ``table`` (None: none, or no table yet)."""
    if table is None:
        return None
    return ColumnMapping.of(table.schema().to_json(), table.metadata().configuration)
