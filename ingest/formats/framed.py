"""Values in the Confluent wire format: a zero byte, a 4-byte schema id, the payload.

The formats a registry holds (Avro, Protobuf, JSON Schema) share everything but the
payload. Here: the framing (a value without the zero byte, or shorter than the header,
is a dead letter), the grouping of a window's values by schema id, the writer's schema
from the registry (``ingest.registry``, cached per process; a registry failure fails
the batch or dead-letters its records, ``on_registry_error``), the bisection of a
failing chunk down to the datums that fail, and the fit of each writer's columns to the
table's. A format is a row of ``FORMATS``: the registry's ``schemaType``, the columns a
writer's schema makes (``Format.columns``) and a reader of its payloads
(``Format.reader``, a chunk of payloads to an Arrow table of those columns). Both get
``FramedSpec.record_name`` too (``[schema_registry] record_name``): the type of the
writer's schema whose fields are the columns, where a schema holds several (a Protobuf
file's messages; None: the format's default, e.g. the file's first message).

The fit of a writer's columns to the table's (``fit``), the same for every format:

* a column the writer has and the table lacks is **added** (top level, nullable): the
  rows carry it, the landing protocol commits the wider schema in the same commit as the
  rows (``ingest.sink.delta``), so no reader sees one without the other;
* a column the table has and the writer lacks is null in its rows, unless the table's
  schema requires it (``FramedSpec.required``: non-nullable in the schema the columns
  came from): **incompatible**;
* a column both have fits when the writer's type is the table's or promotes to it
  without loss (int to a wider int or a float, float to double, a decimal to one of the
  same scale and more digits; structs, lists and maps member by member); any other type
  is **incompatible**: never a silent cast. A nested field the table lacks is
  incompatible too: only top-level columns are added.

The records of an incompatible schema id are dead letters whose reason names the schema
id and each column (``on_incompatible = "dead_letter"``), or the batch stops the run
with ``IncompatibleSchemaError`` (``"fail"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import IncompatibleSchemaError, RegistryError
from ingest.registry import RegisteredSchema, RegistryClient, RegistrySettings, client_for

__all__ = [
    "FORMATS",
    "HEADER",
    "Fit",
    "Format",
    "FramedSpec",
    "Reader",
    "decode_framed",
    "fit",
    "format_of",
]

HEADER = 5  # magic byte 0, then the schema id (big-endian int32)
_LEAF = 8

Reader = Callable[[pa.Array], pa.Table]


@dataclass(frozen=True)
class Format:
    """One payload format: the registry's ``schemaType`` for it, the columns a writer's
    schema makes (a struct: its fields are the columns, nullable where the schema says
    so; a format may give another type for a schema that is not a record, which only a
    key can use, ``FramedSpec.wrap``), and a reader of payloads (the bytes after the
    5-byte header) into a table of those columns (one column for a non-struct type). A
    reader raises on a payload it cannot decode (any exception: the chunk is bisected
    down to that payload, a dead letter). The third argument of both is the record name
    (``FramedSpec.record_name``), which a format may ignore."""

    name: str  # in messages: Avro, Protobuf, JSON Schema
    schema_type: str
    columns: Callable[[RegisteredSchema, RegistryClient, str | None], pa.DataType]
    reader: Callable[[RegisteredSchema, RegistryClient, str | None], Reader]


# value format -> the module whose ``FORMAT`` it is (imported when first used).
FORMATS: dict[str, str] = {
    "avro": "ingest.formats.avro.avro_values",
    "protobuf": "ingest.formats.protobuf.protobuf_values",
    "json_schema": "ingest.formats.json_schema.json_schema",
}


def format_of(name: str) -> Format:
    module = importlib.import_module(FORMATS[name])
    found = module.FORMAT
    assert isinstance(found, Format)
    return found


@dataclass(frozen=True)
class FramedSpec:
    """How a batch's framed values become columns (picklable; built on the driver)."""

    format: str  # a key of FORMATS
    registry: RegistrySettings
    schema: pa.Schema  # the table's value columns (all nullable)
    required: frozenset[str] = frozenset()  # columns the schema they came from requires
    on_registry_error: str = "fail"  # or "dead_letter"
    on_incompatible: str = "dead_letter"  # or "fail"
    # False with a SQL transform: its view's columns are fixed, so a writer's new field
    # makes that writer incompatible instead of adding a column.
    add_columns: bool = True
    # Names a writer's new field cannot take: the columns ingest writes itself.
    reserved: frozenset[str] = frozenset()
    # Set for keys: the writer's whole type (a record's struct, or a primitive) is the one
    # column of this name, instead of a record's fields being the columns.
    wrap: str | None = None
    record_name: str | None = None  # the type whose fields are the columns (see the top)


# -- fitting a writer's columns to the table's ----------------------------------------------


@dataclass(frozen=True)
class Fit:
    """What a writer's columns do to the table: the columns it adds, or why it cannot
    land (empty when it fits)."""

    added: tuple[pa.Field, ...]
    problems: tuple[str, ...]


def fit(writer: pa.StructType, table: pa.Schema, required: frozenset[str] = frozenset()) -> Fit:
    names = {writer.field(i).name: writer.field(i) for i in range(writer.num_fields)}
    problems: list[str] = []
    for column in table:
        found = names.get(column.name)
        if found is None:
            if column.name in required:
                problems.append(f"{column.name}: missing, and the table's schema requires it")
            continue
        why = _promotes(found.type, column.type, column.name)
        if why:
            problems.append(why)
    added = tuple(
        field.with_nullable(True) for name, field in names.items() if name not in table.names
    )
    return Fit(added, tuple(problems))


_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def _promotes(writer: pa.DataType, table: pa.DataType, path: str) -> str:
    """Why ``writer`` values cannot be read as ``table`` values without loss ('' if
    they can)."""
    if writer == table:
        return ""
    if writer in _INTS and (
        (table in _INTS and _INTS.index(writer) <= _INTS.index(table))
        or table in (pa.float32(), pa.float64())
    ):
        return ""
    if writer == pa.float32() and table == pa.float64():
        return ""
    if (
        pa.types.is_decimal(writer)
        and pa.types.is_decimal(table)
        and writer.scale == table.scale
        and writer.precision <= table.precision
    ):
        return ""
    if pa.types.is_struct(writer) and pa.types.is_struct(table):
        table_fields = {table.field(i).name: table.field(i) for i in range(table.num_fields)}
        problems = []
        for i in range(writer.num_fields):
            member = writer.field(i)
            target = table_fields.get(member.name)
            if target is None:
                problems.append(
                    f"{path}.{member.name}: a nested field the table lacks "
                    "(only top-level columns are added)"
                )
                continue
            why = _promotes(member.type, target.type, f"{path}.{member.name}")
            if why:
                problems.append(why)
        return "; ".join(problems)
    if pa.types.is_list(writer) and pa.types.is_list(table):
        return _promotes(writer.value_type, table.value_type, f"{path}[]")
    if pa.types.is_map(writer) and pa.types.is_map(table):
        return _promotes(writer.key_type, table.key_type, f"{path}{{key}}") or _promotes(
            writer.item_type, table.item_type, f"{path}{{value}}"
        )
    return f"{path}: {writer} where the table has {table}"


def _conform(decoded: pa.Table, schema: pa.Schema, added: tuple[pa.Field, ...]) -> pa.Table:
    """``decoded`` as the table's columns (a missing one null, each cast: ``fit`` said
    the casts lose nothing), then the added columns."""
    columns = [
        decoded.column(field.name).cast(field.type)
        if field.name in decoded.column_names
        else pa.nulls(decoded.num_rows, field.type)
        for field in schema
    ]
    columns += [decoded.column(field.name) for field in added]
    return pa.Table.from_arrays(columns, schema=pa.schema([*schema, *added]))


# -- decoding -------------------------------------------------------------------------------


def decode_framed(
    values: pa.Array, spec: FramedSpec
) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
    """The value columns of the decodable records (in ``good`` order; the table's, then
    any a writer adds), their indexes and ``(index, reason)`` of the others."""
    values = values.cast(pa.binary())
    count = len(values)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.asarray(
        pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False), np.int64
    )
    heads = pc.binary_slice(values, 0, HEADER)
    errors: list[tuple[int, str]] = []
    ids = np.full(count, -1, np.int64)
    head_bytes = _fixed_width(heads, valid & (lengths >= HEADER))
    magic_ok = head_bytes[:, 0] == 0
    framed = valid & (lengths >= HEADER) & magic_ok
    ids[framed] = (
        head_bytes[framed, 1].astype(np.int64) << 24
        | head_bytes[framed, 2].astype(np.int64) << 16
        | head_bytes[framed, 3].astype(np.int64) << 8
        | head_bytes[framed, 4].astype(np.int64)
    )
    kind = format_of(spec.format).name
    for i in np.flatnonzero(valid & ~framed):
        if lengths[i] < HEADER:
            why = f"{lengths[i]} bytes, fewer than 5"
        else:
            why = f"magic byte {head_bytes[i, 0]}, not 0"
        errors.append((int(i), f"not Confluent-framed ({kind}): {why}"))
    # An explicit stop: pyarrow 26 sizes its output wrongly with start alone ("Negative
    # buffer resize" on 1,000 values of 8 bytes).
    payloads = pc.binary_slice(values, HEADER, 2**31 - 1)
    parts: list[tuple[np.ndarray, pa.Table]] = []
    nulls = np.flatnonzero(~valid)
    if len(nulls):  # tombstones kept as rows: every field null
        empty = [pa.nulls(len(nulls), field.type) for field in spec.schema]
        parts.append((nulls, pa.Table.from_arrays(empty, schema=spec.schema)))
    for schema_id in np.unique(ids[framed]):
        index = np.flatnonzero(framed & (ids == schema_id))
        decoded, failed = _decode_id(int(schema_id), payloads.take(pa.array(index)), spec)
        errors.extend((int(index[i]), reason) for i, reason in failed)
        if decoded is not None:
            kept = np.arange(len(index))
            if failed:
                kept = np.setdiff1d(kept, [i for i, _ in failed])
            parts.append((index[kept], decoded))
    if not parts:
        return spec.schema.empty_table(), np.empty(0, np.int64), sorted(errors)
    good = np.concatenate([i for i, _ in parts])
    try:
        table = pa.concat_tables([t for _, t in parts], promote_options="default")
    except pa.ArrowInvalid as exc:  # two schema ids add one column with two types
        raise IncompatibleSchemaError(
            f"schema ids {sorted(set(ids[framed].tolist()))} add columns of different types: {exc}"
        ) from None
    if len(good) < 2 or bool(np.all(good[1:] > good[:-1])):  # one schema id: in order
        return table, good, sorted(errors)
    order = np.argsort(good, kind="stable")
    return table.take(pa.array(order)), good[order], sorted(errors)


def _fixed_width(heads: pa.Array, usable: np.ndarray) -> np.ndarray:
    """The first ``HEADER`` bytes of each value as a (count, 5) uint8 array (zeros where
    the value is null or shorter)."""
    count = len(heads)
    out = np.zeros((count, HEADER), np.uint8)
    if not usable.any():
        return out
    chosen = heads.filter(pa.array(usable))
    data = np.frombuffer(chosen.buffers()[2], np.uint8)
    offsets = np.frombuffer(chosen.buffers()[1], np.int32)[chosen.offset :][: len(chosen) + 1]
    starts = offsets[:-1]
    out[usable] = data[starts[:, None] + np.arange(HEADER)]
    return out


def _decode_id(
    schema_id: int, payloads: pa.Array, spec: FramedSpec
) -> tuple[pa.Table | None, list[tuple[int, str]]]:
    """The records of one schema id as the table's value columns (and those the writer
    adds), and the failures by position in ``payloads``."""
    count = len(payloads)
    form = format_of(spec.format)
    client = client_for(spec.registry)
    try:
        registered = client.schema(schema_id)
        if registered.schema_type != form.schema_type:
            why = (
                f"schema id {schema_id} is a {registered.schema_type} schema, "
                f"not {form.schema_type}"
            )
            return None, [(i, why) for i in range(count)]
        columns, reader = _wrapped(
            form.columns(registered, client, spec.record_name),
            form.reader(registered, client, spec.record_name),
            spec.wrap,
        )
    except RegistryError as exc:
        if spec.on_registry_error == "fail":
            raise
        return None, [(i, str(exc)) for i in range(count)]
    except IncompatibleSchemaError as exc:  # a writer's schema the format cannot map
        if spec.on_incompatible == "fail":
            raise
        return None, [(i, f"schema id {schema_id}: {exc}") for i in range(count)]
    fitted = fit(columns, spec.schema, spec.required)
    problems = list(fitted.problems)
    taken = sorted(f.name for f in fitted.added if f.name in spec.reserved)
    if taken:
        problems.append(f"new fields {', '.join(taken)} have the names of ingest's own columns")
    if fitted.added and not spec.add_columns:
        names = ", ".join(f.name for f in fitted.added)
        problems.append(f"new fields {names} (the transform's columns are fixed)")
    if problems:
        why = f"schema id {schema_id} does not fit the table: " + "; ".join(problems)
        if spec.on_incompatible == "fail":
            raise IncompatibleSchemaError(why)
        return None, [(i, why) for i in range(count)]
    tables: list[pa.Table] = []
    failed: list[tuple[int, str]] = []
    _bisect(reader, payloads, 0, tables, failed, form.name)
    if not tables:
        return None, failed
    struct_schema = pa.schema([columns.field(i) for i in range(columns.num_fields)])
    decoded = pa.concat_tables([t.cast(struct_schema) for t in tables])
    return _conform(decoded, spec.schema, fitted.added), failed


def _wrapped(writer: pa.DataType, reader: Reader, wrap: str | None) -> tuple[pa.StructType, Reader]:
    """The columns and reader of a writer's type: a record's fields as columns, or, with
    ``wrap`` (keys), the whole type as one column of that name."""
    if wrap is None:
        if not isinstance(writer, pa.StructType):
            raise IncompatibleSchemaError(f"not a record ({writer}): its fields cannot be columns")
        return writer, reader
    if not isinstance(writer, pa.StructType):
        return pa.struct([pa.field(wrap, writer)]), lambda p: reader(p).rename_columns([wrap])

    def packed(payloads: pa.Array) -> pa.Table:
        table = reader(payloads)
        fields = [writer.field(i) for i in range(writer.num_fields)]
        arrays = [table.column(f.name).combine_chunks().cast(f.type) for f in fields]
        return pa.table({wrap: pa.StructArray.from_arrays(arrays, fields=fields)})

    return pa.struct([pa.field(wrap, writer)]), packed


def _bisect(
    reader: Reader,
    payloads: pa.Array,
    base: int,
    tables: list[pa.Table],
    failed: list[tuple[int, str]],
    kind: str,
) -> None:
    try:
        tables.append(reader(payloads))
        return
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # polars' Rust panics are BaseException (pyo3)
        if len(payloads) <= 1:
            why = f"undecodable {kind} payload: {type(exc).__name__}: {exc}"
            failed.append((base, why[:500]))
            return
        if len(payloads) <= _LEAF:
            for i in range(len(payloads)):
                _bisect(reader, payloads.slice(i, 1), base + i, tables, failed, kind)
            return
    half = len(payloads) // 2
    _bisect(reader, payloads.slice(0, half), base, tables, failed, kind)
    _bisect(reader, payloads.slice(half), base + half, tables, failed, kind)
