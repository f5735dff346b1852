"""Avro values in the Confluent wire format: a zero byte, a 4-byte schema id, the datum.

A window of values decodes a schema id at a time. The writer's schema comes from the
registry (``ingest.registry``, cached per process). Its datums become an Avro object
container held in memory: the header names the writer's schema, and each datum is a
block of one record followed by the sync marker, all built with Arrow compute
(``binary_join_element_wise``), with no Python object per record. polars' Rust reader
then turns the container into Arrow columns. A block per datum, and not one block for
all, because a reader checks the sync marker after each block: a datum with a byte
missing fails its own block, and one with a byte too many cannot shift the next datums
(measured: in one block, a datum with a trailing byte decoded the next ones as garbage
without an error).

polars reads records, arrays, enums, fixed, bytes, the primitives, unions with null,
and the logical types decimal, date, timestamp and local-timestamp (millis, micros) and
uuid. A schema with a map, a union of several non-null types or a time type goes
through fastavro, a record at a time (the slow route, ~10x). A block that fails is
bisected down to its single datums; a datum that does not decode is a dead letter.

Columns follow Spark's ``from_avro``: a record is a struct, an enum a string, fixed and
bytes binary, a union with null is nullable, a union of several types a struct of
``member0``, ``member1``, ...; time-millis an int, time-micros a long; timestamps are
``timestamp[us, UTC]``, local timestamps ``timestamp[us]`` (TIMESTAMP_NTZ). The table's
value columns are the configured ones: a column the writer's schema lacks is null; a field
of the writer's schema the table lacks makes its records dead letters (no field is
dropped in silence; evolving the table is for a later change).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import RegistryError
from ingest.registry import RegistrySettings, client_for
from spark_jobs.avro_fast import polars_reader
from spark_jobs.avro_schema import arrow_type, as_schema, value_schema, vectorized
from spark_jobs.avro_slow import record_reader

__all__ = ["AvroSpec", "arrow_type", "decode_avro", "value_schema"]

HEADER = 5  # magic byte 0, then the schema id (big-endian int32)
_LEAF = 8


@dataclass(frozen=True)
class AvroSpec:
    """How a batch's Avro values become columns (picklable; built on the driver)."""

    registry: RegistrySettings
    schema: pa.Schema  # the table's value columns
    on_registry_error: str = "fail"  # or "dead_letter"


# -- decoding -------------------------------------------------------------------------------


def decode_avro(
    values: pa.Array, spec: AvroSpec
) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
    """The value columns of the decodable records (in ``good`` order), their indexes and
    ``(index, reason)`` of the others."""
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
    for i in np.flatnonzero(valid & ~framed):
        if lengths[i] < HEADER:
            errors.append((int(i), f"not Confluent-framed Avro: {lengths[i]} bytes, fewer than 5"))
        else:
            errors.append(
                (int(i), f"not Confluent-framed Avro: magic byte {head_bytes[i, 0]}, not 0")
            )
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
            kept = np.setdiff1d(np.arange(len(index)), [i for i, _ in failed])
            parts.append((index[kept], decoded))
    if not parts:
        return spec.schema.empty_table(), np.empty(0, np.int64), sorted(errors)
    good = np.concatenate([i for i, _ in parts])
    table = pa.concat_tables([t for _, t in parts])
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
    schema_id: int, payloads: pa.Array, spec: AvroSpec
) -> tuple[pa.Table | None, list[tuple[int, str]]]:
    """The records of one schema id as the table's value columns, and the failures by
    position in ``payloads``."""
    count = len(payloads)
    try:
        registered = client_for(spec.registry).schema(schema_id)
    except RegistryError as exc:
        if spec.on_registry_error == "fail":
            raise
        return None, [(i, str(exc)) for i in range(count)]
    if registered.schema_type != "AVRO":
        why = f"schema id {schema_id} is a {registered.schema_type} schema, not Avro"
        return None, [(i, why) for i in range(count)]
    writer = json.loads(registered.text)
    columns = arrow_type(writer, {})
    if not isinstance(columns, pa.StructType):
        why = f"schema id {schema_id} is not an Avro record"
        return None, [(i, why) for i in range(count)]
    extra = sorted(
        {columns.field(i).name for i in range(columns.num_fields)} - set(spec.schema.names)
    )
    if extra:
        why = f"schema id {schema_id} has fields the table lacks: {', '.join(extra)}"
        return None, [(i, why) for i in range(count)]
    reader = polars_reader(registered.text, writer) if vectorized(writer) else record_reader(writer)
    tables: list[pa.Table] = []
    failed: list[tuple[int, str]] = []
    _bisect(reader, payloads, 0, tables, failed)
    if not tables:
        return None, failed
    decoded = pa.concat_tables([t.cast(as_schema(columns)) for t in tables])
    try:
        return _conform(decoded, spec.schema), failed
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        why = f"schema id {schema_id}: its fields do not fit the table's columns: {exc}"
        return None, [(i, why) for i in range(count)]


def _conform(decoded: pa.Table, schema: pa.Schema) -> pa.Table:
    """``decoded`` as ``schema``'s columns: a missing column null, each cast."""
    columns = [
        decoded.column(field.name).cast(field.type)
        if field.name in decoded.column_names
        else pa.nulls(decoded.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


Reader = Callable[[pa.Array], pa.Table]


def _bisect(
    reader: Reader,
    payloads: pa.Array,
    base: int,
    tables: list[pa.Table],
    failed: list[tuple[int, str]],
) -> None:
    try:
        tables.append(reader(payloads))
        return
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # polars' Rust panics are BaseException (pyo3)
        if len(payloads) <= 1:
            failed.append((base, f"undecodable Avro datum: {type(exc).__name__}: {exc}"[:500]))
            return
        if len(payloads) <= _LEAF:
            for i in range(len(payloads)):
                _bisect(reader, payloads.slice(i, 1), base + i, tables, failed)
            return
    half = len(payloads) // 2
    _bisect(reader, payloads.slice(0, half), base, tables, failed)
    _bisect(reader, payloads.slice(half), base + half, tables, failed)
