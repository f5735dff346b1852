"""JSON values checked against their writer's schema (a ``Node``) and made its columns.

``finish``: the arrays Arrow's JSON reader made of a chunk (``parse_type``: dates and
date-times still strings, every field nullable) checked and converted with Arrow compute,
no Python object per record: a required property whose type does not allow null must be
there and not null (where its object is), an item of an array or a value of a map whose
type does not allow null must not be null, a date-time must be an RFC 3339 date-time with
its offset and a date a full date; date-times become UTC instants (digits past the
microsecond are dropped, as Spark's timestamps hold microseconds), dates days.

``rows``: the slow route, for schemas Arrow's JSON reader cannot read (a map, from an
object without properties): each value parsed with orjson and checked against the node
a record at a time (``walk``), then ``finish`` as above. ``explain``: why one value does
not fit, with the JSON pointer of the first thing wrong in it (the reason of its dead
letter), by the same walk.

JSON types are checked strictly on both routes, never cast: a number where the schema
says string, a string where it says integer, a fraction where it says integer (even
``5.0``), a boolean where it says number all fail. An optional property that is null
though its type does not allow null reads as absent (Arrow cannot tell them apart).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ingest.formats.json_schema.json_schema_types import (
    ARRAY,
    BOOLEAN,
    DATE,
    DATE_TIME,
    INTEGER,
    MAP,
    NUMBER,
    OBJECT,
    STRING,
    TIMESTAMP,
    Node,
    column_type,
    escape,
    parse_type,
)

__all__ = ["explain", "finish", "rows"]

# RFC 3339's date-time (with the space its section 5.6 allows) and full-date.
_DATE_TIME = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
_DATE_TIME_RE = re.compile(_DATE_TIME)
_DATE_RE = re.compile(_DATE)
_PAST_MICROS = r"(\.[0-9]{6})[0-9]+"
_INT64 = (-(2**63), 2**63 - 1)


class Mismatch(ValueError):
    """A value that does not fit its writer's schema: where (a JSON pointer) and why."""

    def __init__(self, pointer: str, why: str) -> None:
        super().__init__(f"{pointer or '/'}: {why}")


# -- vectorised ----------------------------------------------------------------------------


def finish(values: pa.StructArray, node: Node) -> pa.Table:
    """The checked columns of ``values`` (``parse_type(node)``), a ``Mismatch`` naming the
    first check a value fails."""
    done = _finish(values, node, "")
    assert isinstance(done, pa.StructArray)
    if done.null_count:
        raise Mismatch("", "null where the schema says object")
    return pa.Table.from_struct_array(done)


def _finish(array: pa.Array, node: Node, pointer: str) -> pa.Array:
    if node.kind == OBJECT:
        assert isinstance(array, pa.StructArray)
        children, changed = [], False
        # flatten: the children with the struct's nulls (what is under a null struct is
        # nothing to check; pa.array fills it with empty values)
        for prop, child in zip(node.properties, array.flatten(), strict=True):
            path = f"{pointer}/{escape(prop.name)}"
            if not prop.nullable and child.null_count > array.null_count:
                raise Mismatch(path, "required, and missing or null")
            done = _finish(child, prop.node, path)
            changed |= done is not child
            children.append(done)
        if not changed:
            return array
        fields = list(column_type(node))
        return pa.StructArray.from_arrays(children, fields=fields, mask=_mask(array))
    if node.kind in (ARRAY, MAP):
        assert node.items is not None
        offsets = array.offsets
        start = offsets[0].as_py()
        end = offsets[-1].as_py()
        shifted = pc.subtract(offsets, pa.scalar(start, offsets.type))
        inner = array.items if node.kind == MAP else array.values
        inner = inner.slice(start, end - start)
        path = f"{pointer}/*"
        if not node.items.nullable and inner.null_count:
            raise Mismatch(path, f"null where the schema says {node.items.kind}")
        done = _finish(inner, node.items, path)
        if done is inner:
            return array
        if node.kind == ARRAY:
            return pa.ListArray.from_arrays(
                shifted, done, type=column_type(node), mask=_mask(array)
            )
        keys = array.keys.slice(start, end - start)
        return pa.MapArray.from_arrays(
            shifted, keys, done, type=column_type(node), mask=_mask(array)
        )
    if node.kind == DATE_TIME:
        return _instants(array, pointer)
    if node.kind == DATE:
        return _days(array, pointer)
    return array


def _mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _instants(strings: pa.Array, pointer: str) -> pa.Array:
    _formed(strings, _DATE_TIME, pointer, "an RFC 3339 date-time with its offset")
    if pc.any(pc.match_substring_regex(strings, r"\.[0-9]{7}")).as_py():
        strings = pc.replace_substring_regex(strings, _PAST_MICROS, r"\1")
    strings = pc.ascii_upper(strings)  # t and z are allowed (RFC 3339, 5.6)
    try:
        return pc.cast(strings, TIMESTAMP)
    except pa.ArrowInvalid as exc:
        raise Mismatch(pointer, f"not a date-time Arrow reads: {exc}") from None


def _days(strings: pa.Array, pointer: str) -> pa.Array:
    _formed(strings, _DATE, pointer, "a full date (YYYY-MM-DD)")
    try:
        return pc.cast(strings, pa.date32())
    except pa.ArrowInvalid as exc:
        raise Mismatch(pointer, f"not a date Arrow reads: {exc}") from None


def _formed(strings: pa.Array, pattern: str, pointer: str, what: str) -> None:
    matched = pc.fill_null(pc.match_substring_regex(strings, f"^{pattern}$"), True)
    if pc.all(matched).as_py() is False:  # None: no strings
        bad = strings.filter(pc.invert(matched))
        raise Mismatch(pointer, f"{str(bad[0].as_py())[:60]!r} is not {what}")


# -- a record at a time ----------------------------------------------------------------------


def rows(payloads: pa.Array, node: Node) -> pa.Table:
    """The slow route: each payload parsed with orjson and walked, then ``finish``."""
    walked = [walk(_parsed(raw), node, "") for raw in payloads.to_pylist()]
    array = pa.array(walked, parse_type(node))
    assert isinstance(array, pa.StructArray)
    return finish(array, node)


def explain(raw: bytes, node: Node) -> str | None:
    """Why ``raw`` does not fit ``node`` (its pointer and reason), or None if the walk
    finds nothing."""
    try:
        walk(_parsed(raw), node, "")
    except Mismatch as exc:
        return str(exc)
    except Exception:  # the caller then gives Arrow's reason
        return None
    return None


def _parsed(raw: bytes | None) -> Any:
    if raw is None:
        raise Mismatch("", "a null value")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Mismatch("", f"invalid JSON: {exc}") from None


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def walk(value: Any, node: Node, pointer: str) -> Any:
    """``value`` (parsed JSON) as a Python value of ``parse_type(node)``, or ``Mismatch``."""
    if value is None:
        return None  # the parent checks where null is not allowed
    kind = node.kind
    if kind == OBJECT:
        _expect(value, dict, pointer, "object")
        out = {}
        for prop in node.properties:
            path = f"{pointer}/{escape(prop.name)}"
            member = value.get(prop.name)
            if member is None and not prop.nullable:
                raise Mismatch(path, "required, and missing or null")
            out[prop.name] = walk(member, prop.node, path)
        return out
    if kind in (ARRAY, MAP):
        assert node.items is not None
        items = node.items
        _expect(
            value, list if kind == ARRAY else dict, pointer, "array" if kind == ARRAY else "object"
        )
        pairs = enumerate(value) if kind == ARRAY else value.items()
        out_items = []
        for key, member in pairs:
            path = f"{pointer}/{escape(str(key))}"
            if member is None and not items.nullable:
                raise Mismatch(path, f"null where the schema says {items.kind}")
            walked = walk(member, items, path)
            out_items.append(walked if kind == ARRAY else (key, walked))
        return out_items
    if kind in (STRING, DATE, DATE_TIME):
        _expect(value, str, pointer, "string")
        if kind == DATE_TIME and not _DATE_TIME_RE.fullmatch(value):
            raise Mismatch(pointer, f"{value[:60]!r} is not an RFC 3339 date-time with its offset")
        if kind == DATE and not _DATE_RE.fullmatch(value):
            raise Mismatch(pointer, f"{value[:60]!r} is not a full date (YYYY-MM-DD)")
        return value
    if kind == INTEGER:
        if isinstance(value, float) and value.is_integer():
            raise Mismatch(
                pointer, f"{value!r}: an integer must be written as one (no fraction, no exponent)"
            )
        _expect(value, int, pointer, "integer")
        if not _INT64[0] <= value <= _INT64[1]:
            raise Mismatch(pointer, f"{value} does not fit in 64 bits")
        return value
    if kind == NUMBER:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Mismatch(pointer, f"{_JSON_TYPES[type(value)]} where the schema says number")
        try:
            return float(value)
        except OverflowError:
            raise Mismatch(pointer, f"{value} is too large for a double") from None
    assert kind == BOOLEAN
    _expect(value, bool, pointer, "boolean")
    return value


def _expect(value: Any, kind: type, pointer: str, name: str) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        found = _JSON_TYPES.get(type(value), type(value).__name__)
        raise Mismatch(pointer, f"{found} where the schema says {name}")
