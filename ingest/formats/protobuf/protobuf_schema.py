"""Protobuf writers' schemas: the registry's answer to a descriptor pool, and a message's
fields to Arrow columns (see ``protobuf_values.py`` for the choices and docs/protobuf.md).

A registered Protobuf schema is one ``.proto`` file. The registry gives it as a base64
serialized ``FileDescriptorProto`` (Apicurio, and Confluent's registry when asked for
``format=serialized``) or as ``.proto`` text (Confluent's registry by default). ingest
does not parse ``.proto`` text: it asks again with ``format=serialized``, and a registry
that still answers with text (Apicurio, for a schema registered as text, answers with the
descriptor's bytes decoded as UTF-8, which loses bytes) is a clear
``IncompatibleSchemaError``. The files it imports are its ``references`` (other subjects'
versions, fetched and resolved the same way, recursively) or well-known types
(``google/protobuf/*.proto`` from the protobuf package's own descriptors; ``google/type/*``
from googleapis-common-protos, which confluent-kafka's serializers leave unregistered
as built in). Each schema id gets a ``DescriptorPool`` of its own.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError

from ingest.errors import IncompatibleSchemaError, RegistryError
from ingest.registry import RegisteredSchema, RegistryClient

__all__ = [
    "DURATION",
    "TIMESTAMP",
    "UINT64",
    "WriterFile",
    "message_columns",
    "message_path",
    "writer_file",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")
DURATION = pa.int64()  # microseconds: Delta has no interval type
UINT64 = pa.decimal128(20, 0)  # every uint64 (up to 2^64 - 1) exactly; Delta has no unsigned

# Well-known types with a column type of their own: the value, not a struct of its parts.
_WELL_KNOWN: dict[str, pa.DataType] = {
    "google.protobuf.Timestamp": TIMESTAMP,
    "google.protobuf.Duration": DURATION,
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": UINT64,
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
# Messages the decoder (ptars) turns into a value of its own that can be wrong without
# an error (an invalid google.type.Date becomes 1970-01-01): refused, with the reason.
_REFUSED = {
    "google.type.Date": "the decoder turns an invalid date into 1970-01-01 without an error",
    "google.type.TimeOfDay": "the decoder reads it as a time of day, which Delta cannot hold",
}
_SCALARS: dict[int, pa.DataType] = {
    FieldDescriptor.TYPE_DOUBLE: pa.float64(),
    FieldDescriptor.TYPE_FLOAT: pa.float32(),
    FieldDescriptor.TYPE_INT64: pa.int64(),
    FieldDescriptor.TYPE_SINT64: pa.int64(),
    FieldDescriptor.TYPE_SFIXED64: pa.int64(),
    FieldDescriptor.TYPE_UINT64: UINT64,
    FieldDescriptor.TYPE_FIXED64: UINT64,
    FieldDescriptor.TYPE_INT32: pa.int32(),
    FieldDescriptor.TYPE_SINT32: pa.int32(),
    FieldDescriptor.TYPE_SFIXED32: pa.int32(),
    FieldDescriptor.TYPE_UINT32: pa.int64(),
    FieldDescriptor.TYPE_FIXED32: pa.int64(),
    FieldDescriptor.TYPE_BOOL: pa.bool_(),
    FieldDescriptor.TYPE_STRING: pa.string(),
    FieldDescriptor.TYPE_BYTES: pa.binary(),
    FieldDescriptor.TYPE_ENUM: pa.string(),  # the symbol's name
}
# The built-in files a schema may import without a reference, by the module holding each.
_BUILT_IN_PACKAGES = {"google/protobuf/": "google.protobuf", "google/type/": "google.type"}
_MAX_REFERENCES = 1_000


@dataclass(frozen=True)
class WriterFile:
    """A writer's ``.proto`` file, resolved: its descriptor in a pool of its own that
    also holds every file it imports."""

    schema_id: int
    file: FileDescriptor


def writer_file(registered: RegisteredSchema, client: RegistryClient) -> WriterFile:
    """The writer's file of ``registered`` with its imports, in a new pool."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    main = _file_proto(registered, client, registered.schema_id)
    if not main.name:
        main.name = f"schema-{registered.schema_id}.proto"
    _add_imports(pool, main, registered.references, client, added, (main.name,))
    try:
        file = pool.Add(main)
    except (TypeError, KeyError, ValueError) as exc:
        raise IncompatibleSchemaError(f"the Protobuf schema does not build: {exc}") from None
    return WriterFile(registered.schema_id, file)


def _file_proto(
    registered: RegisteredSchema, client: RegistryClient, schema_id: int | None
) -> descriptor_pb2.FileDescriptorProto:
    """The registered text as a ``FileDescriptorProto``, asking the registry for
    ``format=serialized`` when the text is ``.proto`` source."""
    found = _descriptor(registered.text)
    if found is None:
        again = (
            client.schema(schema_id, fmt="serialized")
            if schema_id is not None
            else _serialized_version(registered, client)
        )
        found = _descriptor(again.text)
    if found is None:
        where = f"schema id {schema_id}" if schema_id is not None else repr(registered.subject)
        raise IncompatibleSchemaError(
            f"the registry gives {where} as .proto text, even when asked for "
            "format=serialized; ingest reads Protobuf schemas as serialized "
            "FileDescriptorProtos (base64), as Confluent's registry serves them with "
            "format=serialized and Apicurio serves schemas registered as descriptors "
            "(as confluent-kafka's serializers register them)"
        )
    return found


def _serialized_version(registered: RegisteredSchema, client: RegistryClient) -> RegisteredSchema:
    assert registered.subject is not None and registered.version is not None
    return client.version(registered.subject, registered.version, fmt="serialized")


def _descriptor(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """``text`` as a base64 serialized ``FileDescriptorProto``, or None (not base64:
    ``.proto`` source)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(raw)
    except DecodeError:
        return None


def _add_imports(
    pool: descriptor_pool.DescriptorPool,
    proto: descriptor_pb2.FileDescriptorProto,
    references: Iterable[dict[str, Any]],
    client: RegistryClient,
    added: set[str],
    chain: tuple[str, ...],
) -> None:
    """Adds the files ``proto`` imports to ``pool`` (each before its importers)."""
    by_name = {str(ref.get("name")): ref for ref in references}
    for name in proto.dependency:
        if name in added:
            continue
        if name in chain:
            raise IncompatibleSchemaError(f"the imports go round: {' -> '.join((*chain, name))}")
        if len(added) > _MAX_REFERENCES:
            raise IncompatibleSchemaError(f"more than {_MAX_REFERENCES} imported files")
        ref = by_name.get(name)
        if ref is not None:
            subject, version = str(ref.get("subject")), int(ref.get("version") or 0)
            try:
                imported = client.version(subject, version)
            except RegistryError as exc:
                if exc.retriable:
                    raise
                raise IncompatibleSchemaError(
                    f"its import {name!r} (subject {subject!r} version {version}): {exc}"
                ) from None
            dependency = _file_proto(imported, client, None)
            dependency.name = name
            _add_imports(pool, dependency, imported.references, client, added, (*chain, name))
        else:
            dependency = _built_in(name, chain)
            _add_imports(pool, dependency, (), client, added, (*chain, name))
        try:
            pool.Add(dependency)
        except (TypeError, KeyError, ValueError) as exc:
            raise IncompatibleSchemaError(f"its import {name!r} does not build: {exc}") from None
        added.add(name)


def _built_in(name: str, chain: tuple[str, ...]) -> descriptor_pb2.FileDescriptorProto:
    """A well-known file (``google/protobuf/timestamp.proto`` ...) from the module the
    protobuf package (or googleapis-common-protos) generated for it."""
    for prefix, package in _BUILT_IN_PACKAGES.items():
        if name.startswith(prefix) and name.endswith(".proto"):
            path = name[len(prefix) : -len(".proto")].replace("/", ".")
            module = f"{package}.{path}_pb2"  # google/protobuf/compiler/plugin.proto too
            try:
                file = importlib.import_module(module).DESCRIPTOR
            except ImportError:
                break
            return descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb)
    raise IncompatibleSchemaError(
        f"{chain[-1]} imports {name!r}, which is neither among the schema's references nor "
        "a well-known type"
    )


# -- which message ---------------------------------------------------------------------------


def message_path(file: FileDescriptor, record_name: str | None) -> tuple[Descriptor, list[int]]:
    """The message whose fields are the columns (``record_name``, a full name, or the
    file's first message) and its message indexes (its path in the file, as the wire
    format names it: the top-level index, then nested ones)."""
    tops = list(file.message_types_by_name.values())
    if not tops:
        raise IncompatibleSchemaError("the Protobuf file declares no message")
    if record_name is None:
        return tops[0], [0]
    for index, top in enumerate(tops):
        found = _find(top, record_name, [index])
        if found is not None:
            return found
    names = ", ".join(m.full_name for m in tops)
    raise IncompatibleSchemaError(
        f"no message {record_name!r} (schema_registry.record_name) in the file; its "
        f"top-level messages: {names}"
    )


def _find(message: Descriptor, name: str, path: list[int]) -> tuple[Descriptor, list[int]] | None:
    if message.full_name == name:
        return message, path
    for index, nested in enumerate(message.nested_types):
        found = _find(nested, name, [*path, index])
        if found is not None:
            return found
    return None


def message_at(file: FileDescriptor, indexes: list[int]) -> Descriptor | None:
    """The message the wire format's indexes name in ``file`` (None: out of range)."""
    candidates = list(file.message_types_by_name.values())
    found: Descriptor | None = None
    for index in indexes:
        if not 0 <= index < len(candidates):
            return None
        found = candidates[index]
        candidates = list(found.nested_types)
    return found


# -- columns ------------------------------------------------------------------------------------


def message_columns(message: Descriptor) -> pa.StructType:
    """The columns of ``message``'s fields. Every column is nullable but a proto2
    ``required`` field's (removing a field is legal in Protobuf, so a later writer may
    lack any other); nested fields are all nullable. A field of a message with no fields
    (``google.protobuf.Empty``) has no column (Spark's ``from_protobuf`` drops it too)."""
    count = _field_count(message, {}, 0)
    if count > MAX_FIELDS:
        raise IncompatibleSchemaError(
            f"{message.full_name} expands to {count} fields, over the cap of {MAX_FIELDS} "
            "(anyone who may register a schema is untrusted)"
        )
    fields = _fields(message, (message.full_name,))
    if not fields:
        raise IncompatibleSchemaError(f"{message.full_name} has no field that can be a column")
    return pa.struct(fields)


# A registered schema is untrusted input: nested messages are walked once each (a message
# whose every level holds two fields of the one below expands exponentially when walked as
# a tree), and the columns they make and how deep they nest are bounded.
MAX_FIELDS = 10_000
MAX_DEPTH = 64


def _field_count(message: Descriptor, counted: dict[str, int], depth: int) -> int:
    """The fields under ``message``, nested ones at each use (each message counted once);
    recursion is left to ``_message_type`` to name."""
    if depth > MAX_DEPTH:
        raise IncompatibleSchemaError(f"{message.full_name}: nested over {MAX_DEPTH} levels deep")
    name = message.full_name
    if name in counted:
        return counted[name]
    counted[name] = 0  # a recursive message: counted as nothing here
    total = 0
    for field in message.fields:
        total += 1
        if (
            field.type == FieldDescriptor.TYPE_MESSAGE
            and field.message_type.full_name not in _WELL_KNOWN
        ):
            total += _field_count(field.message_type, counted, depth + 1)
        if total > MAX_FIELDS:
            break
    counted[name] = total
    return total


def _fields(message: Descriptor, chain: tuple[str, ...], *, top: bool = True) -> list[pa.Field]:
    out = []
    for field in message.fields:
        kind = _field_type(field, chain)
        if kind is not None:
            required = top and field.is_required
            out.append(pa.field(field.name, kind, nullable=not required))
    return out


def _field_type(field: FieldDescriptor, chain: tuple[str, ...]) -> pa.DataType | None:
    if field.type == FieldDescriptor.TYPE_GROUP:
        raise IncompatibleSchemaError(f"{field.full_name}: proto2 groups are not supported")
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        kind: pa.DataType | None = _SCALARS[field.type]
    else:
        entry = field.message_type
        if field.is_repeated and entry.GetOptions().map_entry:
            key = _field_type(entry.fields_by_name["key"], chain)
            value = _field_type(entry.fields_by_name["value"], chain)
            if key is None or value is None:
                return None
            return pa.map_(key, value)
        kind = _message_type(entry, (*chain, f"{field.name}: {entry.full_name}"))
    if kind is None:
        return None
    return pa.list_(kind) if field.is_repeated else kind


def _message_type(message: Descriptor, chain: tuple[str, ...]) -> pa.DataType | None:
    name = message.full_name
    if name in _WELL_KNOWN:
        return _WELL_KNOWN[name]
    if name in _REFUSED:
        raise IncompatibleSchemaError(f"{chain[0]}: {name} is not supported ({_REFUSED[name]})")
    if any(link.endswith(f": {name}") for link in chain[:-1]) or chain[0] == name:
        raise IncompatibleSchemaError(
            f"a recursive message ({' -> '.join(chain)}): Delta columns cannot nest without end"
        )
    fields = _fields(message, chain, top=False)
    return pa.struct(fields) if fields else None
