"""The slow route of ``avro_values.py``: fastavro, a record at a time, for what polars cannot
read (maps, unions of several types, time types); values converted to Spark's columns."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ingest.formats.avro.avro_schema import arrow_type, as_schema, full_name

__all__ = ["record_reader"]


def record_reader(writer: Any) -> Callable[[pa.Array], pa.Table]:
    import fastavro

    parsed = fastavro.parse_schema(writer)
    columns = arrow_type(writer, {})
    convert = _converter(writer, {})

    def read(payloads: pa.Array) -> pa.Table:
        rows = []
        for datum in payloads.to_pylist():
            buffer = io.BytesIO(datum)
            record = fastavro.schemaless_reader(buffer, parsed, None, return_record_name=True)
            rows.append(convert(record))
        return pa.Table.from_pylist(rows, schema=as_schema(columns))

    return read


def _converter(avro: Any, names: dict[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """Python values as fastavro gives them -> as ``pa.array`` takes them for
    ``arrow_type(avro)``: unions of several types to member structs, times to ints."""
    if isinstance(avro, list):
        members = [m for m in avro if m != "null"]
        if len(members) == 1:
            inner = _converter(members[0], names)
            return lambda v: None if v is None else inner(v)
        converters = [_converter(m, names) for m in members]
        return lambda v: None if v is None else _member(v, members, converters)
    if isinstance(avro, str):
        return names.get(avro, _same)
    logical = avro.get("logicalType")
    if logical == "time-millis":
        return lambda v: v if isinstance(v, int) else _micros(v) // 1000
    if logical == "time-micros":
        return lambda v: v if isinstance(v, int) else _micros(v)
    kind = avro.get("type")
    if kind == "record":
        fields = [(f["name"], _converter(f["type"], names)) for f in avro.get("fields", [])]

        def record(v: Any) -> Any:
            if isinstance(v, tuple):  # return_record_name: (name, fields) in a union
                v = v[1]
            return {name: convert(v.get(name)) for name, convert in fields}

        names[full_name(avro)] = record
        return record
    if kind == "array":
        item = _converter(avro["items"], names)
        return lambda v: [item(x) for x in v]
    if kind == "map":
        value = _converter(avro["values"], names)
        return lambda v: [(k, value(x)) for k, x in v.items()]
    if isinstance(kind, dict | list):
        return _converter(kind, names)
    return _same


def _same(value: Any) -> Any:
    return value


def _micros(value: Any) -> int:
    return int(
        ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    )


def _member(value: Any, members: list[Any], converters: list[Callable[[Any], Any]]) -> Any:
    """``{"memberK": value}`` for the union member ``value`` is (fastavro gives a record
    in a union as ``(name, fields)``)."""
    for position, member in enumerate(members):
        if _is_member(value, member):
            return {f"member{position}": converters[position](value)}
    raise ValueError(f"no member of the union {members} holds {value!r}")


def _is_member(value: Any, member: Any) -> bool:
    kind = member if isinstance(member, str) else member.get("type")
    if isinstance(value, tuple):
        names = (member.get("name"), full_name(member)) if isinstance(member, dict) else ()
        return kind == "record" and value[0] in names
    check = _MEMBER_CHECKS.get(str(kind))
    return check is not None and check(value)


# Which Python value (as fastavro gives it) a union member holds, by the member's type.
_MEMBER_CHECKS: dict[str, Callable[[Any], bool]] = {
    "boolean": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str),
    "enum": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, bytes),
    "fixed": lambda v: isinstance(v, bytes),
    "array": lambda v: isinstance(v, list),
    "map": lambda v: isinstance(v, dict),
}
