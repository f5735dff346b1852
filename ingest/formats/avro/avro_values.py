"""Avro values in the Confluent wire format: the ``avro`` row of ``framed.FORMATS``.

The framing, the registry, the bisection of failing chunks and the fit of a writer's
columns to the table's are ``framed.py``'s. Here: an Avro writer's schema as columns
(``avro_schema.py``) and its datums as Arrow. The datums of one schema id become an Avro
object container held in memory: the header names the writer's schema, and the datums
follow in blocks, all built with Arrow compute, with no Python object per record. polars'
Rust reader then turns the container into Arrow columns (``avro_fast.py``, which also
keeps a datum with a byte too many from shifting the next ones).

polars reads records, arrays, enums, fixed, bytes, the primitives, unions with null,
and the logical types decimal, date, timestamp and local-timestamp (millis, micros) and
uuid. A schema with a map, a union of several non-null types or a time type goes
through fastavro, a record at a time (``avro_slow.py``, the slow route, ~10x).

Columns follow Spark's ``from_avro``: a record is a struct, an enum a string, fixed and
bytes binary, a union with null is nullable, a union of several types a struct of
``member0``, ``member1``, ...; time-millis an int, time-micros a long; timestamps are
``timestamp[us, UTC]``, local timestamps ``timestamp[us]`` (TIMESTAMP_NTZ).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from ingest.errors import ConfigError, IncompatibleSchemaError
from ingest.formats.avro.avro_fast import polars_reader
from ingest.formats.avro.avro_schema import arrow_type, vectorized
from ingest.formats.avro.avro_slow import record_reader
from ingest.formats.framed import Format, Reader
from ingest.registry import RegisteredSchema, RegistryClient

__all__ = ["FORMAT"]


def _writer(registered: RegisteredSchema) -> Any:
    try:
        return json.loads(registered.text)
    except ValueError as exc:
        raise IncompatibleSchemaError(f"not an Avro schema: {exc}") from None


def _columns(
    registered: RegisteredSchema, _client: RegistryClient, _record_name: str | None
) -> pa.DataType:
    try:
        return arrow_type(_writer(registered), {})
    except ConfigError as exc:
        raise IncompatibleSchemaError(str(exc)) from None


def _reader(
    registered: RegisteredSchema, _client: RegistryClient, _record_name: str | None
) -> Reader:
    writer = _writer(registered)
    text = registered.text
    if not (isinstance(writer, dict) and writer.get("type") == "record"):
        # A key's primitive (or array, enum...): read as a record of one field, whose
        # binary encoding is the field's own.
        writer = {"type": "record", "name": "Wrapped", "fields": [{"name": "v", "type": writer}]}
        text = json.dumps(writer)
    return polars_reader(text, writer) if vectorized(writer) else record_reader(writer)


FORMAT = Format(name="Avro", schema_type="AVRO", columns=_columns, reader=_reader)
