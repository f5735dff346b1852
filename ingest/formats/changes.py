"""Rows that delete: tombstones and Debezium change events, for upsert mode.

Pure pyarrow, run inside Spark's Python tasks by ``decode.py``.

A tombstone (a record whose value is null) under ``table.tombstones = "delete"``
becomes a row marked in ``DELETE_COLUMN``: its Kafka columns, and its merge keys.
Merge keys that are Kafka columns (``key``) are there already; merge keys that are
fields of the JSON value come from the Kafka key (``key_fields``): a JSON object
holding them by name (Debezium's primary-key struct, also inside
``{"schema", "payload"}`` as the JsonConverter writes it with schemas enabled), or,
with one such merge key, the key itself (a JSON scalar, else its UTF-8 text), cast
to the field's type. A key that names no row is a dead letter, never dropped.

A Debezium change event (``table.value.envelope = "debezium"``) is the JSON
``{"before", "after", "source", "op", "ts_ms"}``, plain or as the ``payload`` of
``{"schema", "payload"}``; the configured schema describes ``before`` and
``after``. ``op`` c (create), u (update) and r (snapshot read) upsert ``after``;
d deletes the key of ``before`` (from the Kafka key where ``before`` lacks it).
``t`` (truncate) empties the whole source table: ingest applies changes key by
key, so it is a dead letter saying so, as is an event without a usable ``op`` or
``after``. The tombstone Debezium writes after a delete is a tombstone like any
other (``tombstones``: "delete" deletes the key again, "ignore" skips it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "TOMBSTONE_DEAD_LETTER",
    "Changes",
    "debezium_changes",
    "debezium_schema",
    "key_fields",
    "tombstone_deletes",
]

TOMBSTONE_DEAD_LETTER = (
    'a tombstone (null value), dead-lettered by table.tombstones = "dead_letter"'
)
_UPSERT_OPS = ("c", "u", "r")
_MISSING = object()


class Changes:
    """Decoded rows of some records: the records kept (Kafka columns), their value
    fields (None: the values are not json), which of them delete, and (index, error)
    of the records refused."""

    def __init__(
        self,
        records: pa.Table,
        fields: pa.Table | None,
        deletes: pa.Array,
        errors: list[tuple[int, str]],
    ) -> None:
        self.records = records
        self.fields = fields
        self.deletes = deletes
        self.errors = errors


def _unwrap(document: object) -> object:
    """The payload of the JsonConverter's ``{"schema": ..., "payload": ...}``."""
    if isinstance(document, dict) and set(document) == {"schema", "payload"}:
        return document["payload"]
    return document


def _key_document(raw: bytes) -> object:
    try:
        return _unwrap(orjson.loads(raw))
    except orjson.JSONDecodeError:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return _MISSING


def _cast(values: list[object], kind: pa.DataType) -> pa.Array:
    """``values`` as ``kind``; strings are cast (the text of a number, a timestamp)."""
    array = pa.array(values)
    return array if array.type == kind else array.cast(kind)


def key_fields(
    keys: pa.Array, wanted: Sequence[pa.Field]
) -> tuple[list[pa.Array], list[tuple[int, str]]]:
    """The fields ``wanted`` read from each Kafka key (see the module doc): one array
    per field (null where the key failed), and (index, error) of the keys that fail."""
    count = len(keys)
    columns: list[list[object]] = [[None] * count for _ in wanted]
    errors: dict[int, str] = {}
    for i, raw in enumerate(keys.to_pylist()):
        if raw is None:
            errors[i] = "a null key: nothing names the row to delete"
            continue
        document = _key_document(raw)
        for column, field in zip(columns, wanted, strict=True):
            if isinstance(document, dict):
                value = document.get(field.name, _MISSING)
            elif len(wanted) == 1 and document is not _MISSING:
                value = document
            else:
                value = _MISSING
            if value is _MISSING or value is None or isinstance(value, (dict, list)):
                errors.setdefault(
                    i, f"the key {raw[:200]!r} does not give the field {field.name!r}"
                )
            else:
                column[i] = value
    arrays: list[pa.Array] = []
    for column, field in zip(columns, wanted, strict=True):
        for i in errors:
            column[i] = None
        try:
            arrays.append(_cast(column, field.type))
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass
        for i, value in enumerate(column):  # the slow way, to name the keys that fail
            if value is None:
                continue
            try:
                _cast([value], field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                errors.setdefault(i, f"the key's {field.name!r} is not a {field.type}: {value!r}")
                column[i] = None
        arrays.append(_cast(column, field.type))
    return arrays, sorted(errors.items())


def _key_columns(schema: pa.Schema, merge_keys: Sequence[str]) -> list[pa.Field]:
    """The merge keys that are value fields (the rest are Kafka columns)."""
    return [schema.field(name) for name in merge_keys if name in schema.names]


def tombstone_deletes(
    tombstones: pa.Table, json_schema: pa.Schema | None, merge_keys: Sequence[str]
) -> Changes:
    """Delete rows of tombstones: their merge keys, the other value fields null."""
    count = tombstones.num_rows
    schema = json_schema or pa.schema([])
    wanted = _key_columns(schema, merge_keys)
    arrays, errors = key_fields(tombstones.column("key").combine_chunks(), wanted)
    keep = np.ones(count, bool)
    keep[[i for i, _ in errors]] = False
    mask = pa.array(keep)
    kept = tombstones.filter(mask)
    flags = pa.array(np.ones(kept.num_rows, bool))
    if json_schema is None:  # binary or string values: the merge keys are Kafka columns
        return Changes(kept, None, flags, errors)
    found = dict(zip((f.name for f in wanted), arrays, strict=True))
    fields = pa.Table.from_arrays(
        [found.get(f.name, pa.nulls(count, f.type)) for f in schema],
        schema=pa.schema([f.with_nullable(True) for f in schema]),
    )
    return Changes(kept, fields.filter(mask), flags, errors)


def debezium_schema(row: pa.Schema) -> pa.Schema:
    """What a change event is parsed as: plain, or inside ``payload``."""
    kind = pa.struct([f.with_nullable(True) for f in row])
    change = [pa.field("before", kind), pa.field("after", kind), pa.field("op", pa.string())]
    return pa.schema([pa.field("payload", pa.struct(change)), *change])


def _event_error(op: str | None, has_after: bool) -> str | None:
    if op is None:
        return 'not a Debezium change event: no "op" (plain, or in "payload")'
    if op == "t":
        return (
            'a Debezium truncate (op "t") empties the whole source table; ingest applies '
            "changes key by key and does not truncate"
        )
    if op in _UPSERT_OPS:
        return None if has_after else f'a Debezium "{op}" event without "after"'
    if op == "d":
        return None
    return f"unknown Debezium op {op!r} (expected c, u, r, d or t)"


def debezium_changes(
    records: pa.Table, events: pa.Table, row: pa.Schema, merge_keys: Sequence[str]
) -> Changes:
    """Rows of parsed change ``events`` (``debezium_schema``), one per record."""
    payload = events.column("payload").combine_chunks()
    wrapped = payload.is_valid()

    def pick(name: str) -> pa.Array:
        return pc.if_else(
            wrapped, pc.struct_field(payload, name), events.column(name).combine_chunks()
        )

    op, before, after = pick("op"), pick("before"), pick("after")
    deletes = pc.fill_null(pc.equal(op, "d"), False)
    errors: list[tuple[int, str]] = []
    has_after = after.is_valid().to_numpy(zero_copy_only=False)
    for i, name in enumerate(op.to_pylist()):
        problem = _event_error(name, bool(has_after[i]))
        if problem:
            errors.append((i, problem))
    columns = {
        f.name: pc.if_else(deletes, pc.struct_field(before, f.name), pc.struct_field(after, f.name))
        for f in row
    }
    # A delete whose ``before`` lacks a merge key takes it from the Kafka key.
    wanted = _key_columns(row, merge_keys)
    if wanted:
        lacking = pc.and_(deletes, pc.invert(before.is_valid()))
        for field in wanted:
            lacking = pc.or_(lacking, pc.and_(deletes, columns[field.name].is_null()))
        mask = pc.fill_null(lacking, False)
        index = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if len(index):
            keys = records.column("key").combine_chunks().take(pa.array(index))
            arrays, key_errors = key_fields(keys, wanted)
            errors += [(int(index[j]), message) for j, message in key_errors]
            for field, values in zip(wanted, arrays, strict=True):
                columns[field.name] = pc.replace_with_mask(
                    columns[field.name], mask, values.cast(columns[field.name].type)
                )
    fields = pa.Table.from_arrays(
        list(columns.values()), schema=pa.schema([f.with_nullable(True) for f in row])
    )
    errors.sort()
    if not errors:
        return Changes(records, fields, deletes, [])
    keep = np.ones(records.num_rows, bool)
    keep[[i for i, _ in errors]] = False
    mask = pa.array(keep)
    return Changes(records.filter(mask), fields.filter(mask), deletes.filter(mask), errors)
