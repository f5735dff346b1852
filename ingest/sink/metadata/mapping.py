"""Column mapping (Delta's ``columnMapping`` feature, modes ``name`` and ``id``): the
physical names and Parquet field ids a table's data files carry for its logical columns.

Delta Spark turns it on when a column is renamed or dropped. The table's schema then gives
every field, nested ones too, ``delta.columnMapping.physicalName`` and
``delta.columnMapping.id``. A reader in mode ``name`` finds a column in a file by its
physical name, in mode ``id`` by its Parquet field id; an add action's statistics and
partition values are keyed by physical name (PROTOCOL.md, "Column Mapping").

``ColumnMapping.of(schema_json, configuration)`` reads them from a table's metaData;
``physical(table)`` renames a batch's columns and their nested struct fields and gives each
its field id. The data is not copied: a renamed nested type has the same layout (an Arrow
view). A column the mapping lacks (a batch's new column) keeps its name and has no id: the
commit finds the table's mapping differs from the one the files were written with, and the
batch is written again (``DeltaTarget.commit_files``). pyarrow only: tasks get it pickled.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "COLUMN_ID",
    "FIELD_ID",
    "MAX_COLUMN_ID",
    "MODE",
    "PHYSICAL_NAME",
    "ColumnMapping",
    "MappedField",
    "Shape",
    "covering",
    "logical",
    "mapped_fields",
    "max_column_id",
    "physical_name",
]

MODE = "delta.columnMapping.mode"
MAX_COLUMN_ID = "delta.columnMapping.maxColumnId"
PHYSICAL_NAME = "delta.columnMapping.physicalName"
COLUMN_ID = "delta.columnMapping.id"
FIELD_ID = b"PARQUET:field_id"  # what pyarrow writes as a Parquet field id


@dataclass(frozen=True)
class Shape:
    """Where struct fields sit in a column's type: a struct's own ``fields``, an array's
    ``element``, a map's ``key`` and ``value`` (None: no struct below)."""

    fields: tuple[MappedField, ...] = ()
    element: Shape | None = None
    key: Shape | None = None
    value: Shape | None = None


@dataclass(frozen=True)
class MappedField:
    """One field of the table's schema: its logical ``name``, ``physical`` name and ``id``."""

    name: str
    physical: str
    id: int | None
    shape: Shape | None = None


def _shape(kind: Any) -> Shape | None:
    if not isinstance(kind, dict):
        return None  # a primitive type
    if kind.get("type") == "struct":
        return Shape(fields=tuple(_mapped(f) for f in kind.get("fields", ())))
    if kind.get("type") == "array":
        element = _shape(kind.get("elementType"))
        return None if element is None else Shape(element=element)
    if kind.get("type") == "map":
        key, value = _shape(kind.get("keyType")), _shape(kind.get("valueType"))
        return None if key is None and value is None else Shape(key=key, value=value)
    return None


def _mapped(field: Mapping[str, Any]) -> MappedField:
    metadata = field.get("metadata") or {}
    name = str(field["name"])
    column_id = metadata.get(COLUMN_ID)
    return MappedField(
        name=name,
        physical=str(metadata.get(PHYSICAL_NAME, name)),
        id=None if column_id is None else int(column_id),
        shape=_shape(field.get("type")),
    )


def _physical_field(field: pa.Field, mapped: MappedField | None) -> pa.Field:
    if mapped is None:
        return field
    metadata = dict(field.metadata or {})
    if mapped.id is not None:
        metadata[FIELD_ID] = str(mapped.id).encode()
    return pa.field(
        mapped.physical,
        _physical_type(field.type, mapped.shape),
        field.nullable,
        metadata or None,
    )


def _physical_type(kind: pa.DataType, shape: Shape | None) -> pa.DataType:
    if shape is None:
        return kind
    if pa.types.is_struct(kind):
        by_name = {f.name: f for f in shape.fields}
        children = [kind.field(i) for i in range(kind.num_fields)]
        return pa.struct([_physical_field(c, by_name.get(c.name)) for c in children])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        value = kind.value_field.with_type(_physical_type(kind.value_type, shape.element))
        return pa.list_(value) if pa.types.is_list(kind) else pa.large_list(value)
    if pa.types.is_map(kind):
        return pa.map_(
            kind.key_field.with_type(_physical_type(kind.key_type, shape.key)),
            kind.item_field.with_type(_physical_type(kind.item_type, shape.value)),
            kind.keys_sorted,
        )
    return kind


@dataclass(frozen=True)
class ColumnMapping:
    """A table's column mapping: its ``mode`` and its top-level ``fields``."""

    mode: str
    fields: tuple[MappedField, ...]

    @classmethod
    def of(cls, schema_json: str, configuration: Mapping[str, str | None]) -> ColumnMapping | None:
        """The mapping of a table with this schema (Delta's JSON) and configuration;
        None when it maps no column (mode ``none`` or unset)."""
        mode = configuration.get(MODE) or "none"
        if mode == "none":
            return None
        shape = _shape(json.loads(schema_json))
        return cls(mode, () if shape is None else shape.fields)

    def _by_name(self) -> dict[str, MappedField]:
        return {f.name: f for f in self.fields}

    def physical_name(self, name: str) -> str:
        """The physical name of the top-level column ``name`` (itself if unmapped)."""
        mapped = self._by_name().get(name)
        return name if mapped is None else mapped.physical

    def logical_name(self, physical: str) -> str:
        """The logical name of the top-level column ``physical`` (itself if unmapped)."""
        return next((f.name for f in self.fields if f.physical == physical), physical)

    def logical(self, table: pa.Table) -> pa.Table:
        """A data file's rows with its top-level columns' logical names (unmapped ones,
        e.g. a dropped column's, as they are); nested fields keep their physical names."""
        logical = {f.physical: f.name for f in self.fields}
        return table.rename_columns([logical.get(n, n) for n in table.column_names])

    def physical(self, table: pa.Table) -> pa.Table:
        """``table`` with physical names and field ids (its data shared, not copied)."""
        by_name = self._by_name()
        fields = []
        columns = []
        for field, column in zip(table.schema, table.columns, strict=True):
            target = _physical_field(field, by_name.get(field.name))
            if pa.types.is_nested(field.type) and target is not field:
                column = pa.chunked_array([c.view(target.type) for c in column.chunks], target.type)
            fields.append(target)
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=pa.schema(fields, table.schema.metadata))


def physical_name(mapping: ColumnMapping | None, name: str) -> str:
    """``mapping.physical_name(name)``; ``name`` itself for a table without column mapping."""
    return name if mapping is None else mapping.physical_name(name)


def logical(mapping: ColumnMapping | None, rows: pa.Table) -> pa.Table:
    """``mapping.logical(rows)``; ``rows`` themselves for a table without column mapping."""
    return rows if mapping is None else mapping.logical(rows)


def covering(mapping: ColumnMapping | None, names: Sequence[str]) -> tuple[Any, ...] | None:
    """How ``mapping`` maps the columns ``names`` (None: a table without column mapping),
    to compare the mapping a batch's files were written with and the table's now."""
    if mapping is None:
        return None
    by_name = mapping._by_name()
    return (mapping.mode, *(by_name.get(n) for n in names))


def _assign(kind: Any, last: int) -> int:
    """Gives the struct fields nested in ``kind`` (Delta's JSON type, changed in place) ids
    after ``last`` and new physical names; returns the last id given."""
    if isinstance(kind, dict):
        if kind.get("type") == "struct":
            for field in kind.get("fields", ()):
                last += 1
                metadata = field.setdefault("metadata", {})
                metadata[COLUMN_ID] = last
                metadata[PHYSICAL_NAME] = f"col-{uuid.uuid4()}"
                last = _assign(field.get("type"), last)
        elif kind.get("type") == "array":
            last = _assign(kind.get("elementType"), last)
        elif kind.get("type") == "map":
            last = _assign(kind.get("valueType"), _assign(kind.get("keyType"), last))
    return last


def mapped_fields(fields: Sequence[Mapping[str, Any]], max_column_id: int) -> tuple[list[Any], int]:
    """New top-level ``fields`` (Delta's JSON) as a table with column mapping adds them, as
    Delta Spark does: every field, nested ones too, a new id after ``max_column_id`` and a
    physical name ``col-<uuid>``; and the table's new ``maxColumnId``."""
    struct = json.loads(json.dumps({"type": "struct", "fields": list(fields)}))
    last = _assign(struct, max_column_id)
    return struct["fields"], last


def max_column_id(schema_json: str, configuration: Mapping[str, str | None]) -> int:
    """The table's ``maxColumnId`` (or, if it lacks one, the highest id its schema uses)."""
    known = configuration.get(MAX_COLUMN_ID)
    if known:
        return int(known)
    found = re.findall(r'"delta\.columnMapping\.id":\s*(\d+)', schema_json)
    return max((int(n) for n in found), default=0)
