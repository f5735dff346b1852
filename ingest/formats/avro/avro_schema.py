"""Avro schemas as Arrow columns, Spark's ``from_avro`` conventions (see ``avro_values.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ingest.errors import ConfigError

__all__ = [
    "LOCAL_TIMESTAMP",
    "TIMESTAMP",
    "arrow_type",
    "as_schema",
    "full_name",
    "vectorized",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")
LOCAL_TIMESTAMP = pa.timestamp("us")


def arrow_type(avro: Any, names: dict[str, pa.DataType]) -> pa.DataType:
    """The Arrow type of an Avro type (parsed JSON), Spark's ``from_avro`` conventions."""
    if isinstance(avro, list):
        members = [m for m in avro if m != "null"]
        if len(members) == 1:
            return arrow_type(members[0], names)
        return pa.struct(
            [pa.field(f"member{i}", arrow_type(m, names)) for i, m in enumerate(members)]
        )
    if isinstance(avro, str):
        if avro in _PRIMITIVE:
            return _PRIMITIVE[avro]
        if avro in names:
            return names[avro]
        raise ConfigError(f"Avro type {avro!r} is not defined (or is recursive)", key="schema")
    kind = avro.get("type")
    logical = _logical(avro)
    if logical is not None:
        return logical
    if kind == "record":
        name = full_name(avro)
        fields = [
            pa.field(f["name"], arrow_type(f["type"], names), nullable=_nullable(f["type"]))
            for f in avro.get("fields", [])
        ]
        names[name] = pa.struct(fields)
        return names[name]
    if kind == "enum":
        names[full_name(avro)] = pa.string()
        return pa.string()
    if kind == "fixed":
        names[full_name(avro)] = pa.binary()
        return pa.binary()
    if kind == "array":
        return pa.list_(arrow_type(avro["items"], names))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(avro["values"], names))
    return arrow_type(kind, names)


_PRIMITIVE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def _logical(avro: Mapping[str, Any]) -> pa.DataType | None:
    logical, kind = avro.get("logicalType"), avro.get("type")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
        if precision > 38:
            raise ConfigError(f"decimal({precision}, {scale}): Delta holds 38 digits at most")
        return pa.decimal128(precision, scale)
    table = {
        ("date", "int"): pa.date32(),
        ("time-millis", "int"): pa.int32(),
        ("time-micros", "long"): pa.int64(),
        ("timestamp-millis", "long"): TIMESTAMP,
        ("timestamp-micros", "long"): TIMESTAMP,
        ("local-timestamp-millis", "long"): LOCAL_TIMESTAMP,
        ("local-timestamp-micros", "long"): LOCAL_TIMESTAMP,
        ("uuid", "string"): pa.string(),
    }
    return table.get((logical, str(kind))) if isinstance(logical, str) else None


def _nullable(avro: Any) -> bool:
    return isinstance(avro, list) and "null" in avro


def full_name(avro: Mapping[str, Any]) -> str:
    name = str(avro["name"])
    namespace = avro.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


def vectorized(avro: Any) -> bool:
    """Whether polars reads this schema into the columns above."""
    if isinstance(avro, list):
        members = [m for m in avro if m != "null"]
        return len(members) <= 1 and all(vectorized(m) for m in members)
    if isinstance(avro, str):
        return True
    if avro.get("logicalType") in ("time-millis", "time-micros"):
        return False
    kind = avro.get("type")
    if kind == "map":
        return False
    if kind == "record":
        return all(vectorized(f["type"]) for f in avro.get("fields", []))
    if kind == "array":
        return vectorized(avro["items"])
    return not isinstance(kind, dict | list) or vectorized(kind)


def as_schema(struct: pa.StructType) -> pa.Schema:
    return pa.schema([struct.field(i) for i in range(struct.num_fields)])
