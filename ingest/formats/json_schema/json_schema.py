"""JSON Schema values in the Confluent wire format: the ``json_schema`` row of
``framed.FORMATS`` (docs/json_schema.md).

The wire format is confluent-kafka's ``JSONSerializer``'s (and the Java one's): the zero
byte, the writer's schema id (4 bytes, big-endian), then the value as UTF-8 JSON text.
The framing, the registry, the bisection of failing chunks and the fit of a writer's
columns to the table's are ``framed.py``'s. Here: the writer's JSON Schema as columns
(``json_schema_types.py``) and a chunk of JSON payloads as those columns, checked
against the schema (``json_schema_values.py``).

A chunk is parsed at once by Arrow's JSON reader, the route format ``json`` takes
(``text_values.json_rows``), given the columns' Arrow types (dates and date-times read as
strings), with no Python object per record; its checks (required properties, non-null
items, date and date-time forms) and conversions run with Arrow compute. The reader
refuses a JSON type the schema does not give (never a cast), so a chunk holding a value
that does not fit fails whole, and the frame bisects it down to that value; its dead
letter's reason then comes from ``explain``: the JSON pointer of what is wrong, and why.
A schema with a map (an object with no properties but an ``additionalProperties``
schema) goes a record at a time (orjson, ``json_schema_values.rows``): Arrow's JSON
reader makes no maps.
"""

from __future__ import annotations

import threading

import pyarrow as pa

from ingest.formats.framed import Format, Reader
from ingest.formats.json_schema.json_schema_types import (
    Node,
    columns,
    has_map,
    parse_type,
    schema_node,
)
from ingest.formats.json_schema.json_schema_values import explain, finish, rows
from ingest.formats.text_values import json_rows
from ingest.registry import RegisteredSchema, RegistryClient

__all__ = ["FORMAT"]

# (registry URLs, schema id) -> its node: the frame asks for the columns and a reader
# of each schema id in every window; its references are fetched once.
_NODES: dict[tuple[tuple[str, ...], int], Node] = {}
_NODES_LOCK = threading.Lock()


def _node(registered: RegisteredSchema, client: RegistryClient) -> Node:
    key = (client.settings.urls, registered.schema_id)
    with _NODES_LOCK:
        found = _NODES.get(key)
    if found is None:
        found = schema_node(registered, client)
        with _NODES_LOCK:
            _NODES[key] = found
    return found


def _columns(
    registered: RegisteredSchema, client: RegistryClient, _record_name: str | None
) -> pa.StructType:
    return columns(_node(registered, client))


def _reader(
    registered: RegisteredSchema, client: RegistryClient, _record_name: str | None
) -> Reader:
    node = _node(registered, client)
    parsed = parse_type(node)
    assert isinstance(parsed, pa.StructType)
    schema = pa.schema(list(parsed))
    slow = has_map(node)
    where = f"does not fit schema id {registered.schema_id}"

    def read(payloads: pa.Array) -> pa.Table:
        try:
            if slow:
                return rows(payloads, node)
            table = json_rows(payloads, schema)
            return finish(_struct(table, parsed), node)
        except Exception as exc:
            if len(payloads) != 1:
                raise  # the frame bisects: only a single value's reason is kept
            why = explain(payloads[0].as_py(), node) or str(exc)
            raise ValueError(f"{where}: {why}") from None

    return read


def _struct(table: pa.Table, parsed: pa.StructType) -> pa.StructArray:
    columns = [column.combine_chunks() for column in table.columns]
    return pa.StructArray.from_arrays(columns, fields=list(parsed))


FORMAT = Format(name="JSON Schema", schema_type="JSON", columns=_columns, reader=_reader)
