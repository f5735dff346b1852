"""Protobuf values in the Confluent wire format: the ``protobuf`` row of ``framed.FORMATS``.

The framing (magic byte, schema id), the registry, the bisection of failing chunks and
the fit of a writer's columns to the table's are ``framed.py``'s. After the 5-byte header
a Protobuf value holds its **message indexes**, then the message's bytes. The indexes
name the message in the writer's file: a zigzag varint count, then that many zigzag
varints, the top-level message's index first, then nested ones; a single 0 byte (a count
of 0) means ``[0]``, the file's first message, which is what confluent-kafka's
serializer writes for it (``confluent_kafka/schema_registry/common/serde.py``,
``SchemaId._read_index_array``; Java's serializers write the same).

The table's message is ``[schema_registry] record_name`` (a full name) when set, else
the file's first; a value whose indexes name another message is a dead letter saying
which. The writer's file and its imports come from the registry (``protobuf_schema.py``).

Columns (``protobuf_schema.message_columns``; Spark's ``from_protobuf`` where Delta can
hold it): a message is a struct, repeated a list, a map a map, a oneof's members
nullable fields, an enum its symbol's name (an unknown number: the number as text),
Timestamp ``timestamp[us, UTC]``, Duration BIGINT microseconds (Delta has no interval
type), the wrappers (StringValue, Int64Value, ...) their nullable primitive, int32,
sint32, sfixed32 INT, int64, sint64, sfixed64 BIGINT, uint32, fixed32 BIGINT, uint64,
fixed64 DECIMAL(20,0) (every value exactly, where Spark's default wraps past 2^63).
A field without presence (a proto3 scalar) that a value does not set lands as its
default (0, "", false), as Protobuf readers see it; a field with presence (a message,
a oneof member, proto3 ``optional``, proto2 ``optional``) lands null. Recursive
messages, proto2 groups, google.type.Date and TimeOfDay are refused
(``IncompatibleSchemaError``, a dead letter or a stop by ``on_incompatible``).

Decoding: ptars (Rust, from PyPI) parses the message bytes of a whole chunk straight
into Arrow builders, with no Python object per record, from the writer's descriptor;
its columns are then cast to the ones above (uint64 to decimal, durations to
microseconds). A payload that does not parse raises, and the frame bisects to it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import Descriptor

from ingest.formats.framed import Format, Reader
from ingest.formats.protobuf.protobuf_schema import (
    message_at,
    message_columns,
    message_path,
    writer_file,
)
from ingest.registry import RegisteredSchema, RegistryClient, RegistrySettings

__all__ = ["FORMAT", "encode_indexes", "split_indexes"]

_MAX_INDEXES = 100_000  # as confluent-kafka's reader
_END = 2**31 - 1  # binary_slice's stop (see framed.decode_framed)


@dataclass(frozen=True)
class _Writer:
    """One writer's schema for one table message: the message, its columns, its
    indexes on the wire and a decoder of its bytes into Arrow."""

    message: Descriptor
    columns: pa.StructType
    indexes: tuple[int, ...]
    prefix: bytes
    decoder: object  # a ptars MessageHandler
    chosen: bool  # by record_name (else the file's first message)


_WRITERS: dict[tuple[RegistrySettings, int, str | None], _Writer] = {}
_LOCK = threading.Lock()


def _writer(
    registered: RegisteredSchema, client: RegistryClient, record_name: str | None
) -> _Writer:
    """The writer of ``registered`` (built once per process: an id never changes)."""
    key = (client.settings, registered.schema_id, record_name)
    with _LOCK:
        found = _WRITERS.get(key)
    if found is not None:
        return found
    from ptars import HandlerPool, PtarsConfig

    file = writer_file(registered, client).file
    message, indexes = message_path(file, record_name)
    columns = message_columns(message)  # refuses what cannot be columns, before ptars
    config = PtarsConfig(
        timestamp_tz="UTC",
        timestamp_unit="us",
        duration_unit="us",
        time_unit="us",
        enum_repr="string",
    )
    decoder = HandlerPool([file], config=config).get_for_message(message)
    writer = _Writer(
        message,
        columns,
        tuple(indexes),
        encode_indexes(indexes),
        decoder,
        record_name is not None,
    )
    with _LOCK:
        _WRITERS[key] = writer
    return writer


def _columns(
    registered: RegisteredSchema, client: RegistryClient, record_name: str | None
) -> pa.StructType:
    return _writer(registered, client, record_name).columns


def _reader(
    registered: RegisteredSchema, client: RegistryClient, record_name: str | None
) -> Reader:
    writer = _writer(registered, client, record_name)
    schema = pa.schema([writer.columns.field(i) for i in range(writer.columns.num_fields)])

    def read(payloads: pa.Array) -> pa.Table:
        bodies = _bodies(payloads.cast(pa.binary()), writer)
        batch = writer.decoder.array_to_record_batch(bodies)  # type: ignore[attr-defined]
        table = pa.Table.from_arrays([batch.column(f.name) for f in schema], names=schema.names)
        return table.cast(schema)

    return read


# -- message indexes ---------------------------------------------------------------------------


def encode_indexes(indexes: list[int]) -> bytes:
    """The message indexes as confluent-kafka's serializer writes them (``[0]``: one 0)."""
    if list(indexes) == [0]:
        return b"\x00"
    out = bytearray()
    for value in (len(indexes), *indexes):
        _write_zigzag(out, value)
    return bytes(out)


def _write_zigzag(out: bytearray, value: int) -> None:
    n = (value << 1) ^ (value >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def split_indexes(payload: bytes) -> tuple[list[int], int]:
    """The message indexes at the start of ``payload`` and where the message starts;
    ``ValueError`` when they are cut short or out of bounds."""
    count, at = _read_zigzag(payload, 0)
    if count == 0:
        return [0], at
    if not 0 < count <= _MAX_INDEXES:
        raise ValueError(f"bad message indexes: a count of {count}")
    indexes = []
    for _ in range(count):
        value, at = _read_zigzag(payload, at)
        indexes.append(value)
    return indexes, at


def _read_zigzag(payload: bytes, at: int) -> tuple[int, int]:
    n, shift = 0, 0
    while True:
        if at >= len(payload):
            raise ValueError("bad message indexes: cut short")
        byte = payload[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), at
        if shift > 63:
            raise ValueError("bad message indexes: a varint longer than 10 bytes")


def _bodies(payloads: pa.Array, writer: _Writer) -> pa.Array:
    """The message bytes of each payload, after its indexes (which must name the table's
    message): sliced with Arrow compute when every payload starts with the usual
    encoding of them, else a payload at a time."""
    prefix = writer.prefix
    usual = pc.starts_with(payloads, pattern=prefix)
    if pc.all(usual).as_py() is not False:
        return pc.binary_slice(payloads, len(prefix), _END)
    bodies = []
    for payload in payloads.to_pylist():
        indexes, start = split_indexes(payload)
        if tuple(indexes) != writer.indexes:
            raise ValueError(_other_message(indexes, writer))
        bodies.append(payload[start:])
    return pa.array(bodies, pa.binary())


def _other_message(indexes: list[int], writer: _Writer) -> str:
    other = message_at(writer.message.file, indexes)
    named = f"name {other.full_name}" if other is not None else "name no message of the file"
    which = (
        "schema_registry.record_name"
        if writer.chosen
        else "the file's first; schema_registry.record_name chooses another"
    )
    return (
        f"message indexes {indexes} {named}, not the table's message "
        f"{writer.message.full_name} ({which})"
    )


FORMAT = Format(name="Protobuf", schema_type="PROTOBUF", columns=_columns, reader=_reader)
