"""Segment records to table rows: Spark-compatible types, offset filter, value decoding.

Pure pyarrow, run inside Spark's Python tasks (and usable anywhere). A segment
holds ``RECORD_SCHEMA`` batches; Spark takes none of its dictionary topic or
millisecond timestamps, so ``spark_records`` casts them (topic to string,
timestamp to ``timestamp[us, UTC]``, headers to ``array<struct<key, value>>``).

Values decode by the table's ``value_format``:

* ``binary``: kept as they are.
* ``string``: UTF-8 checked; a value that is not UTF-8 is a dead letter.
* ``avro``: Confluent-framed Avro, the writers' schemas from the registry
  (``avro.py``); the fields become columns like json's.
* ``json``: the fields of the configured schema become columns (``value`` is
  dropped). A whole segment parses at once with ``pyarrow.json`` over the
  values joined by newlines. That is only sound when every line is one value, so
  values holding a newline, or not starting with ``{``, are first normalized
  one by one with orjson (which also rejects what is not one JSON object); the
  line count is then checked, and a block that fails is bisected down to
  single records, whose errors become dead letters. A null value (tombstone)
  is a row whose fields are all null.

Tombstones (null values) go by ``tombstones``: "keep" (append: a row as above),
"ignore" (no row), "dead_letter", or "delete" (upsert: a row marked in
``DELETE_COLUMN`` with its merge keys, ``changes.py``). With the "debezium"
envelope each JSON value is a change event whose ``after`` (or, for a delete,
``before``) gives the fields (``changes.py``). Upsert rows carry ``DELETE_COLUMN``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from ingest.errors import ConfigError
from ingest.sink.config import BASE_COLUMNS, DEAD_LETTER_COLUMN, DELETE_COLUMN, TableConfig
from ingest.sink.deadletter import HEADERS_TYPE, STAGE_DECODE, dead_letters
from spark_jobs.avro import AvroSpec, decode_avro, value_schema
from spark_jobs.changes import (
    TOMBSTONE_DEAD_LETTER,
    debezium_changes,
    debezium_schema,
    tombstone_deletes,
)

__all__ = [
    "DecodeSpec",
    "Decoded",
    "decode",
    "drop_through",
    "spark_records",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")
_LEAF = 16
_WINDOW = 65_536
_OPEN_BRACE = ord("{")


@dataclass(frozen=True)
class DecodeSpec:
    """How a batch's values become columns (picklable; built on the driver)."""

    value_format: str = "binary"
    json_schema: pa.Schema | None = None
    date_column: str | None = None
    tombstones: str = "keep"  # delete, ignore, dead_letter or keep
    envelope: str = "none"  # or debezium
    merge_keys: tuple[str, ...] = ()
    deletes: bool = False  # rows carry DELETE_COLUMN (upsert)
    avro: AvroSpec | None = None  # value_format "avro"

    @property
    def fields_schema(self) -> pa.Schema | None:
        """The value's fields as columns (json and avro), else None."""
        return self.avro.schema if self.avro is not None else self.json_schema

    def __post_init__(self) -> None:
        if self.tombstones == "delete" and not self.deletes:
            raise ConfigError('"delete" needs upsert mode', key="table.tombstones")
        if self.envelope == "debezium" and (self.value_format != "json" or not self.deletes):
            raise ConfigError(
                "debezium needs json values in upsert mode", key="table.value.envelope"
            )
        if self.value_format == "avro" and self.avro is None:
            raise ConfigError("avro values need a registry", key="schema_registry")
        if self.value_format in ("json", "avro"):
            fields = self.fields_schema
            if fields is None:
                raise ConfigError("json values need a schema", key="table.value.schema")
            taken = {*BASE_COLUMNS, "value", DEAD_LETTER_COLUMN, DELETE_COLUMN}
            if self.date_column:
                taken.add(self.date_column)
            clashes = sorted(set(fields.names) & taken)
            if clashes:
                raise ConfigError(
                    f"value fields {clashes} collide with the Kafka columns",
                    key="table.value.schema",
                )

    def record_schema(self) -> pa.Schema:
        """The Kafka columns (value as configured, json: raw binary)."""
        value = pa.string() if self.value_format == "string" else pa.binary()
        return pa.schema(
            [
                pa.field("topic", pa.string()),
                pa.field("partition", pa.int32()),
                pa.field("offset", pa.int64()),
                pa.field("timestamp", TIMESTAMP),
                pa.field("timestamp_type", pa.int8()),
                pa.field("key", pa.binary()),
                pa.field("value", value),
                pa.field("headers", HEADERS_TYPE),
            ]
        )

    def output_schema(self) -> pa.Schema:
        fields = list(self.record_schema())
        value_fields = self.fields_schema
        if value_fields is not None:
            fields = [f for f in fields if f.name != "value"]
        if self.date_column:
            fields.append(pa.field(self.date_column, pa.date32()))
        if value_fields is not None:
            fields.extend(f.with_nullable(True) for f in value_fields)
        if self.deletes:
            fields.append(pa.field(DELETE_COLUMN, pa.bool_()))
        return pa.schema(fields)


@dataclass(frozen=True)
class Decoded:
    rows: pa.Table  # output_schema
    dead: pa.Table  # DEAD_LETTER_SCHEMA


def spark_records(segment: pa.Table) -> pa.Table:
    """A segment's records in the types Spark and Delta take (value still binary)."""
    columns = [
        segment.column("topic").cast(pa.string()),
        segment.column("partition"),
        segment.column("offset"),
        segment.column("timestamp").cast(TIMESTAMP),
        segment.column("timestamp_type"),
        segment.column("key"),
        segment.column("value"),
        segment.column("headers").cast(HEADERS_TYPE),
    ]
    return pa.Table.from_arrays(
        columns,
        names=[
            "topic",
            "partition",
            "offset",
            "timestamp",
            "timestamp_type",
            "key",
            "value",
            "headers",
        ],
    )


def drop_through(records: pa.Table, offset: int | None) -> pa.Table:
    """The records above ``offset`` (all of them when it is None)."""
    if offset is None or records.num_rows == 0:
        return records
    offsets = records.column("offset")
    if pc.min(offsets).as_py() > offset:
        return records
    return records.filter(pc.greater(offsets, offset))


def decode(
    records: pa.Table, spec: DecodeSpec, *, ingest_time: dt.datetime | None = None
) -> Decoded:
    """Decodes ``spark_records`` output into rows of ``spec.output_schema()`` and
    dead letters, ``_WINDOW`` records at a time: the copies decoding makes (the values
    joined into lines, the parser's buffers) then stay small and reuse the same memory
    instead of touching fresh pages for a whole task (page faults cost ~0.4 CPU s per
    million records on this machine's VM, measured)."""
    if records.num_rows <= _WINDOW:
        return _decode_window(records, spec, ingest_time)
    parts = [
        _decode_window(records.slice(start, _WINDOW), spec, ingest_time)
        for start in range(0, records.num_rows, _WINDOW)
    ]
    return Decoded(
        pa.concat_tables([part.rows for part in parts]),
        pa.concat_tables([part.dead for part in parts]),
    )


def _decode_window(records: pa.Table, spec: DecodeSpec, ingest_time: dt.datetime | None) -> Decoded:
    schema = spec.output_schema()
    # (records, their value fields or None, which delete or None), then the refused.
    parts: list[tuple[pa.Table, pa.Table | None, pa.Array | None]] = []
    refused: list[tuple[pa.Table, list[str]]] = []
    values = records.column("value")
    if spec.tombstones != "keep" and values.null_count:
        null = values.is_null()
        tombstones = records.filter(null)
        records = records.filter(pc.invert(null))
        if spec.tombstones == "dead_letter":
            refused.append((tombstones, [TOMBSTONE_DEAD_LETTER] * tombstones.num_rows))
        elif spec.tombstones == "delete":
            deleted = tombstone_deletes(tombstones, spec.fields_schema, spec.merge_keys)
            parts.append((deleted.records, deleted.fields, deleted.deletes))
            refused.append(_refused(tombstones, deleted.errors))
    if spec.value_format == "binary":
        parts.append((records, None, None))
    elif spec.value_format == "string":
        good_index, errors = _utf8(records.column("value").combine_chunks())
        good, bad, messages = _split(records, good_index, errors)
        good = good.set_column(
            good.schema.get_field_index("value"), "value", good.column("value").cast(pa.string())
        )
        parts.append((good, None, None))
        if bad is not None:
            refused.append((bad, messages))
    elif spec.value_format == "avro":
        assert spec.avro is not None
        fields, good_index, errors = decode_avro(
            records.column("value").combine_chunks(), spec.avro
        )
        good, bad, messages = _split(records, good_index, errors)
        parts.append((good, fields, None))
        if bad is not None:
            refused.append((bad, messages))
    else:
        assert spec.json_schema is not None
        values = records.column("value").combine_chunks()
        envelope = spec.envelope == "debezium"
        parsed_schema = debezium_schema(spec.json_schema) if envelope else spec.json_schema
        fields, good_index, errors = _json(values, parsed_schema)
        good, bad, messages = _split(records, good_index, errors)
        if bad is not None:
            refused.append((bad, messages))
        if envelope:
            changes = debezium_changes(good, fields, spec.json_schema, spec.merge_keys)
            parts.append((changes.records, changes.fields, changes.deletes))
            refused.append(_refused(good, changes.errors))
        else:
            parts.append((good, fields, None))
    rows = pa.concat_tables([_rows(spec, schema, *part) for part in parts])
    if len(parts) > 1 and rows.num_rows:
        rows = rows.take(pc.sort_indices(rows.column("offset")))
    refused = [(bad, messages) for bad, messages in refused if bad.num_rows]
    if not refused:
        dead = dead_letters(records.slice(0, 0), STAGE_DECODE, [], ingest_time=ingest_time)
    else:
        dead = pa.concat_tables(
            [dead_letters(bad, STAGE_DECODE, m, ingest_time=ingest_time) for bad, m in refused]
        )
        if len(refused) > 1:
            dead = dead.take(pc.sort_indices(dead.column("offset")))
    return Decoded(rows, dead)


def _refused(records: pa.Table, errors: list[tuple[int, str]]) -> tuple[pa.Table, list[str]]:
    if not errors:
        return records.slice(0, 0), []
    index = pa.array([i for i, _ in errors], pa.int64())
    return records.take(index), [message for _, message in errors]


def _rows(
    spec: DecodeSpec,
    schema: pa.Schema,
    records: pa.Table,
    fields: pa.Table | None,
    deletes: pa.Array | None,
) -> pa.Table:
    """Rows of ``schema`` from decoded records (their value fields: json, avro)."""
    if spec.value_format in ("json", "avro"):
        assert fields is not None
        records = records.drop_columns(["value"])
        for name in fields.column_names:
            records = records.append_column(name, fields.column(name))
    elif spec.value_format == "string" and records.schema.field("value").type != pa.string():
        records = records.set_column(
            records.schema.get_field_index("value"),
            "value",
            records.column("value").cast(pa.string()),
        )
    if spec.date_column:
        records = records.append_column(
            spec.date_column, records.column("timestamp").cast(pa.date32())
        )
    if spec.deletes:
        flags = deletes if deletes is not None else pa.array(np.zeros(records.num_rows, bool))
        records = records.append_column(DELETE_COLUMN, flags)
    return records.select(schema.names).cast(schema)


def _split(
    records: pa.Table, good_index: np.ndarray, errors: list[tuple[int, str]]
) -> tuple[pa.Table, pa.Table | None, list[str]]:
    if not errors:
        return records, None, []
    bad_index = np.fromiter((i for i, _ in errors), np.int64, len(errors))
    return (
        records.take(pa.array(good_index)),
        records.take(pa.array(bad_index)),
        [message for _, message in errors],
    )


# -- string --------------------------------------------------------------------------------


def _utf8(values: pa.Array) -> tuple[np.ndarray, list[tuple[int, str]]]:
    count = len(values)

    def check(lo: int, hi: int) -> bool:
        try:
            values.slice(lo, hi - lo).cast(pa.string())
            return True
        except pa.ArrowInvalid:
            return False

    errors: list[tuple[int, str]] = []

    def leaf(i: int) -> None:
        raw = values[i].as_py()
        if raw is None:
            return
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append((i, f"value is not UTF-8: {exc}"))

    _bisect(0, count, check, leaf)
    bad = {i for i, _ in errors}
    good = np.fromiter((i for i in range(count) if i not in bad), np.int64) if bad else None
    return (np.arange(count, dtype=np.int64) if good is None else good), sorted(errors)


def _bisect(
    lo: int, hi: int, check: Callable[[int, int], bool], leaf: Callable[[int], None]
) -> None:
    """Calls ``leaf`` for each index of every failing run of at most _LEAF items."""
    if hi <= lo or check(lo, hi):
        return
    if hi - lo <= _LEAF:
        for i in range(lo, hi):
            leaf(i)
        return
    middle = (lo + hi) // 2
    _bisect(lo, middle, check, leaf)
    _bisect(middle, hi, check, leaf)


# -- json ------------------------------------------------------------------------------------


def _parse_block(lines: pa.Array, schema: pa.Schema) -> pa.Table | str:
    """The rows of newline-free JSON objects, one per line, or the error."""
    count = len(lines)
    if count == 0:
        return schema.empty_table()
    joined = pc.binary_join(
        pa.ListArray.from_arrays(pa.array([0, count], pa.int32()), lines), b"\n"
    )
    # One value: its bytes are the whole data buffer of the joined array.
    offsets = np.frombuffer(joined.buffers()[1], np.int32, 2)
    body = joined.buffers()[2].slice(int(offsets[0]), int(offsets[1] - offsets[0]))
    try:
        table = pajson.read_json(
            pa.BufferReader(body),
            read_options=pajson.ReadOptions(block_size=16 << 20),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return str(exc)
    if table.num_rows != count:
        return f"{count} values gave {table.num_rows} rows"
    return table


def _needs_normalizing(values: pa.Array) -> np.ndarray:
    """Indices of non-null values that may not be exactly one line holding one object."""
    count = len(values)
    if count == 0:
        return np.empty(0, np.int64)
    offsets = np.frombuffer(values.buffers()[1], np.int32, values.offset + count + 1)
    offsets = offsets[values.offset :]
    data_buffer = values.buffers()[2]
    valid = (
        np.ones(count, bool)
        if values.null_count == 0
        else values.is_valid().to_numpy(zero_copy_only=False)
    )
    lengths = np.diff(offsets)
    suspect = valid & (lengths == 0)
    if data_buffer is not None and len(data_buffer):
        data = np.frombuffer(data_buffer, np.uint8)
        starts = np.minimum(offsets[:-1], len(data) - 1)
        suspect |= valid & (lengths > 0) & (data[starts] != _OPEN_BRACE)
        first, end = int(offsets[0]), int(offsets[-1])
        raw = data_buffer.slice(first, end - first).to_pybytes()
        # Two memchr scans: a regex over the segment cost a third of the whole decode.
        if b"\n" in raw or b"\r" in raw:
            body = data[first:end]
            positions = np.flatnonzero((body == ord("\n")) | (body == ord("\r"))) + first
            owners = np.searchsorted(offsets, positions, side="right") - 1
            suspect[owners] |= valid[owners]
    return np.flatnonzero(suspect)


def _json(
    values: pa.Array, schema: pa.Schema
) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
    """(fields of the good values, their indices, (index, error) of the bad ones)."""
    count = len(values)
    values = values.cast(pa.binary())
    errors: dict[int, str] = {}
    replaced: dict[int, bytes] = {}
    for i in _needs_normalizing(values).tolist():
        raw = values[i].as_py()
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            errors[i] = f"invalid JSON: {exc}"
            continue
        if not isinstance(parsed, dict):
            errors[i] = f"not a JSON object: a {type(parsed).__name__}"
            continue
        replaced[i] = orjson.dumps(parsed)
    if values.null_count:
        for i in np.flatnonzero(~values.is_valid().to_numpy(zero_copy_only=False)).tolist():
            replaced[i] = b"{}"  # a tombstone: every field null
    lines = values
    if replaced:
        patch_index = np.fromiter(replaced, np.int64, len(replaced))
        index = np.arange(count, dtype=np.int64)
        index[patch_index] = count + np.arange(len(patch_index))
        patches = pa.array(list(replaced.values()), pa.binary())
        lines = pa.concat_arrays([values, patches]).take(pa.array(index))
    candidates = (
        np.arange(count, dtype=np.int64)
        if not errors
        else np.setdiff1d(
            np.arange(count, dtype=np.int64), np.fromiter(errors, np.int64, len(errors))
        )
    )
    block = lines if not errors else lines.take(pa.array(candidates))
    pieces: list[tuple[int, int, pa.Table]] = []
    failed: set[int] = set()

    def check(lo: int, hi: int) -> bool:
        parsed = _parse_block(block.slice(lo, hi - lo), schema)
        if isinstance(parsed, str):
            return False
        pieces.append((lo, hi, parsed))
        return True

    def leaf(i: int) -> None:
        parsed = _parse_block(block.slice(i, 1), schema)
        if isinstance(parsed, str):
            errors[int(candidates[i])] = parsed
            failed.add(i)
        else:
            pieces.append((i, i + 1, parsed))

    _bisect(0, len(block), check, leaf)
    pieces.sort(key=lambda piece: piece[0])
    fields = pa.concat_tables([piece for _, _, piece in pieces]) if pieces else schema.empty_table()
    good = candidates if not failed else np.delete(candidates, sorted(failed))
    return fields, good, sorted(errors.items())


def table_spec(config: TableConfig, json_schema: pa.Schema | None) -> DecodeSpec:
    """How ``config``'s values decode, given its value schema in Arrow (json, or avro
    with a DDL schema; None otherwise)."""
    avro = None
    if config.value_format == "avro":
        assert config.registry is not None
        columns = json_schema or value_schema(config.value_avro_schema or "")
        avro = AvroSpec(config.registry, columns, config.on_registry_error)
        json_schema = None
    return DecodeSpec(
        config.value_format,
        json_schema,
        config.date_column,
        tombstones=config.tombstones or "keep",
        envelope=config.value_envelope,
        merge_keys=config.merge_keys,
        deletes=config.deletes,
        avro=avro,
    )
