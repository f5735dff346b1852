"""Segment records to table rows: Spark-compatible types, offset filter, value decoding.

Pure pyarrow, run inside Spark's Python tasks (and usable anywhere). A segment
holds ``RECORD_SCHEMA`` batches; Spark takes none of its dictionary topic or
millisecond timestamps, so ``spark_records`` casts them (topic to string,
timestamp to ``timestamp[us, UTC]``, headers to ``array<struct<key, value>>``).

Values decode by the table's ``value_format``:

* ``binary``: kept as they are.
* ``string``: UTF-8 checked; a value that is not UTF-8 is a dead letter.
* ``avro`` (and the other ``REGISTRY_FORMATS``): values in the Confluent wire format,
  the writers' schemas from the registry (``framed.py``); the fields become columns like
  json's, and a writer's new top-level fields become new columns after them (the batch's
  rows then carry columns beyond ``output_schema``: ``added_columns``).
* ``json``: the fields of the configured schema become columns (``value`` is
  dropped), parsed a window at a time (``text_values.py``); what does not parse
  is a dead letter. A null value (tombstone) is a row whose fields are all null.

Tombstones (null values) go by ``tombstones``: "keep" (append: a row as above),
"ignore" (no row), "dead_letter", or "delete" (upsert: a row marked in
``DELETE_COLUMN`` with its merge keys, ``changes.py``). With the "debezium"
envelope each JSON value is a change event whose ``after`` (or, for a delete,
``before``) gives the fields (``changes.py``). Upsert rows carry ``DELETE_COLUMN``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import ConfigError, RegistryError
from ingest.formats.changes import (
    TOMBSTONE_DEAD_LETTER,
    debezium_changes,
    debezium_schema,
    tombstone_deletes,
)
from ingest.formats.framed import FramedSpec, decode_framed, format_of
from ingest.formats.routes import selected
from ingest.formats.text_values import json_fields, utf8_errors
from ingest.registry import RegisteredSchema, client_for
from ingest.sink.deadletter import HEADERS_TYPE, STAGE_DECODE, dead_letters
from ingest.sink.table_config import (
    BASE_COLUMNS,
    DEAD_LETTER_COLUMN,
    DELETE_COLUMN,
    FIELD_FORMATS,
    REGISTRY_FORMATS,
    RowSelect,
    TableConfig,
)

__all__ = [
    "DecodeSpec",
    "Decoded",
    "added_columns",
    "decode",
    "drop_through",
    "spark_records",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")
_WINDOW = 65_536
# A decoded key rides beside the raw one until the rows are made (dead letters keep
# the raw bytes).
KEY_DECODED = "__key_decoded"


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
    framed: FramedSpec | None = None  # the REGISTRY_FORMATS
    key_format: str = "binary"  # or "string", or a REGISTRY_FORMATS one (``key_framed``)
    key_framed: FramedSpec | None = None  # its schema: the one column KEY_DECODED
    refuse: str | None = None  # every record a dead letter for this reason (no route)
    select: RowSelect | None = None  # only these records are the table's (routes.py)

    @property
    def key_type(self) -> pa.DataType:
        if self.key_framed is not None:
            return self.key_framed.schema.field(0).type
        return pa.string() if self.key_format == "string" else pa.binary()

    @property
    def fields_schema(self) -> pa.Schema | None:
        """The value's fields as columns (json and the registry's formats), else None."""
        return self.framed.schema if self.framed is not None else self.json_schema

    def __post_init__(self) -> None:
        if self.tombstones == "delete" and not self.deletes:
            raise ConfigError('"delete" needs upsert mode', key="table.tombstones")
        if self.envelope == "debezium" and (self.value_format != "json" or not self.deletes):
            raise ConfigError(
                "debezium needs json values in upsert mode", key="table.value.envelope"
            )
        if self.value_format in REGISTRY_FORMATS and self.framed is None:
            raise ConfigError(f"{self.value_format} values need a registry", key="schema_registry")
        if self.value_format in FIELD_FORMATS:
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
                pa.field("key", self.key_type),
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
        pa.concat_tables([part.rows for part in parts], promote_options="default"),
        pa.concat_tables([part.dead for part in parts]),
    )


def added_columns(schema: pa.Schema, spec: DecodeSpec) -> list[pa.Field]:
    """The columns of ``schema`` (decoded rows, or their value fields) beyond
    ``spec.output_schema()``: those new writers' schemas add (nullable)."""
    known = set(spec.output_schema().names) | {"value"}
    return [field.with_nullable(True) for field in schema if field.name not in known]


def _decode_window(records: pa.Table, spec: DecodeSpec, ingest_time: dt.datetime | None) -> Decoded:
    schema = spec.output_schema()
    # (records, their value fields or None, which delete or None), then the refused.
    parts: list[tuple[pa.Table, pa.Table | None, pa.Array | None]] = []
    refused: list[tuple[pa.Table, list[str]]] = []
    if spec.select is not None:
        records = records.filter(selected(records, spec.select))
    if spec.refuse is not None:
        dead = dead_letters(
            records, STAGE_DECODE, [spec.refuse] * records.num_rows, ingest_time=ingest_time
        )
        return Decoded(schema.empty_table(), dead)
    if spec.key_format != "binary":
        records, bad_keys = _decode_keys(records, spec)
        refused.append(bad_keys)
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
        good_index, errors = utf8_errors(records.column("value").combine_chunks())
        good, bad, messages = _split(records, good_index, errors)
        good = good.set_column(
            good.schema.get_field_index("value"), "value", good.column("value").cast(pa.string())
        )
        parts.append((good, None, None))
        if bad is not None:
            refused.append((bad, messages))
    elif spec.framed is not None:
        fields, good_index, errors = decode_framed(
            records.column("value").combine_chunks(), spec.framed
        )
        schema = pa.schema([*schema, *added_columns(fields.schema, spec)])
        good, bad, messages = _split(records, good_index, errors)
        parts.append((good, fields, None))
        if bad is not None:
            refused.append((bad, messages))
    else:
        assert spec.json_schema is not None
        values = records.column("value").combine_chunks()
        envelope = spec.envelope == "debezium"
        parsed_schema = debezium_schema(spec.json_schema) if envelope else spec.json_schema
        fields, good_index, errors = json_fields(values, parsed_schema)
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


def _decode_keys(
    records: pa.Table, spec: DecodeSpec
) -> tuple[pa.Table, tuple[pa.Table, list[str]]]:
    """``records`` whose keys decode, each with its decoded key in ``KEY_DECODED`` (the
    raw ``key`` stays for dead letters), and the others with their reasons."""
    keys = records.column("key").combine_chunks()
    if spec.key_framed is not None:
        columns, good_index, errors = decode_framed(keys, spec.key_framed)
        decoded = columns.column(0)
    else:
        good_index, errors = utf8_errors(keys)
        decoded = keys.take(pa.array(good_index)).cast(pa.string())
    good, bad, messages = _split(records, good_index, errors)
    good = good.append_column(KEY_DECODED, decoded)
    return good, (
        bad if bad is not None else records.slice(0, 0),
        [f"key: {m}" for m in messages],
    )


def _refused(records: pa.Table, errors: list[tuple[int, str]]) -> tuple[pa.Table, list[str]]:
    if not errors:
        return records.slice(0, 0), []
    # From a buffer: pa.array() of a list imports pandas (0.25-0.7 s in a task process).
    positions = np.array([i for i, _ in errors], np.int64)
    index = pa.Array.from_buffers(pa.int64(), len(positions), [None, pa.py_buffer(positions)])
    return records.take(index), [message for _, message in errors]


def _rows(
    spec: DecodeSpec,
    schema: pa.Schema,
    records: pa.Table,
    fields: pa.Table | None,
    deletes: pa.Array | None,
) -> pa.Table:
    """Rows of ``schema`` from decoded records (their value fields: json, the registry's
    formats; a column ``schema`` adds that a part lacks is null in its rows)."""
    if KEY_DECODED in records.column_names:
        records = records.drop_columns(["key"])
        records = records.rename_columns(
            ["key" if name == KEY_DECODED else name for name in records.column_names]
        )
    if spec.value_format in FIELD_FORMATS:
        assert fields is not None
        records = records.drop_columns(["value"])
        for name in fields.column_names:
            records = records.append_column(name, fields.column(name))
        for field in schema:
            if field.name not in records.column_names and field.name not in (
                spec.date_column,
                DELETE_COLUMN,
            ):
                records = records.append_column(field, pa.nulls(records.num_rows, field.type))
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


def _nullable_within(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every struct field nullable: a null key or value (a tombstone kept
    as a row) is a null struct, which Arrow will not cast to one whose fields refuse
    nulls."""
    if isinstance(kind, pa.StructType):
        return pa.struct(
            [
                kind.field(i).with_type(_nullable_within(kind.field(i).type)).with_nullable(True)
                for i in range(kind.num_fields)
            ]
        )
    if isinstance(kind, pa.ListType):
        return pa.list_(_nullable_within(kind.value_type))
    return kind


def subject_latest(config: TableConfig) -> RegisteredSchema | None:
    """The latest schema of a ``{topic}`` table's own subject (None: it has none to
    read). A registry that does not answer fails the batch (retried); one that has no
    such subject stops the run (``ConfigError``): the table has no columns to take."""
    if config.value_subject is None or config.registry is None:
        return None
    try:
        return client_for(config.registry).latest(config.value_subject)
    except RegistryError as exc:
        if exc.retriable:
            raise
        raise ConfigError(
            f"{config.uri}: no columns: the registry did not give the latest schema of "
            f"{config.value_subject!r}: {exc}",
            key="table.value.schema",
        ) from None


def table_spec(config: TableConfig, json_schema: pa.Schema | None) -> DecodeSpec:
    """How ``config``'s values decode, given its value schema in Arrow (json, or a
    registry's format with a DDL schema; None otherwise)."""
    framed = None
    if config.value_format in REGISTRY_FORMATS:
        assert config.registry is not None
        if json_schema is None:
            registered = config.value_registered or subject_latest(config)
            if registered is None:
                raise ConfigError(
                    f"{config.value_format} values need columns: a DDL schema or the "
                    "subject's latest schema",
                    key="table.value.schema",
                )
            struct = format_of(config.value_format).columns(
                registered, client_for(config.registry), config.record_name
            )
            if not isinstance(struct, pa.StructType):
                raise ConfigError(
                    f"the subject's latest schema is not a record ({struct}): its fields "
                    "cannot be columns",
                    key="table.value.schema",
                )
            json_schema = pa.schema([struct.field(i) for i in range(struct.num_fields)])
        framed = FramedSpec(
            config.value_format,
            config.registry,
            pa.schema(
                [f.with_type(_nullable_within(f.type)).with_nullable(True) for f in json_schema]
            ),
            required=frozenset(f.name for f in json_schema if not f.nullable),
            on_registry_error=config.on_registry_error,
            on_incompatible=config.on_incompatible,
            add_columns=not config.transform,
            reserved=frozenset(
                {*BASE_COLUMNS, "value", DEAD_LETTER_COLUMN, DELETE_COLUMN}
                | ({config.date_column} if config.date_column else set())
            ),
            record_name=config.record_name,
        )
        json_schema = None
    key_framed = None
    if config.key_format in REGISTRY_FORMATS:
        assert config.registry is not None and config.key_registered is not None
        key_type = format_of(config.key_format).columns(
            config.key_registered, client_for(config.registry), config.key_record_name
        )
        key_framed = FramedSpec(
            config.key_format,
            config.registry,
            pa.schema([pa.field("key", _nullable_within(key_type))]),
            on_registry_error=config.on_registry_error,
            on_incompatible=config.on_incompatible,
            wrap="key",
            record_name=config.key_record_name,
        )
    return DecodeSpec(
        config.value_format,
        json_schema,
        config.date_column,
        tombstones=config.tombstones or "keep",
        envelope=config.value_envelope,
        merge_keys=config.merge_keys,
        deletes=config.deletes,
        framed=framed,
        key_format=config.key_format,
        key_framed=key_framed,
        refuse=config.refuse,
        select=config.select,
    )
