"""Protobuf decode benchmark: Confluent-framed Protobuf values in memory -> Arrow columns.

1M values (``--records``) of a 10-field message with a nested message, a Timestamp, an
enum, a repeated string and a StringValue wrapper (~80 bytes each), serialized by
confluent-kafka's ``ProtobufSerializer`` (the message class built at run time from a
FileDescriptorProto) through a real schema registry (Apicurio, started by the harness),
then decoded by:

* ingest's ``ingest.formats.framed.decode_framed`` with format "protobuf" (header and message
  indexes with Arrow compute, ptars' Rust decoder, the cast to the documented columns),
  in windows of 65,536 values as the decoder runs them;
* protobuf's upb a message at a time, ``json_format.MessageToDict`` and
  ``pa.Table.from_pylist``: what a Python consumer writes without a columnar decoder (its
  types are JSON's: int64 as strings, the Timestamp as text);
* upb a message at a time into one Python list per column, written by hand for this
  message (no generic walk), then ``pa.array`` per column with the same types as
  ingest's: the best a route through upb's messages does;
* upb's parse alone (``FromString`` per value, no columns at all): the ceiling of any
  route that makes a Python message per record.

The registry's answer is cached before timing (every route fetches the schema once).

    .venv/bin/python scripts/bench/protobuf_decode.py [--records 1000000] [--repeat 3]

The last line is ``RESULT records_per_s=<ingest> vs_message_to_dict=<ratio>
vs_upb_columns=<ratio>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ingest.formats.framed import FramedSpec, decode_framed
from ingest.registry import RegistrySettings
from ingest.testing import SchemaRegistry

WINDOW = 65_536
COLUMNS = pa.schema(
    [
        ("id", pa.int64()),
        ("user", pa.string()),
        ("cents", pa.int64()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("kind", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("note", pa.string()),
        ("score", pa.float64()),
        ("ok", pa.bool_()),
        ("device", pa.struct([("os", pa.string()), ("build", pa.int32())])),
    ]
)


def event_class() -> Any:
    from google.protobuf import (
        descriptor_pb2,
        descriptor_pool,
        message_factory,
        timestamp_pb2,
        wrappers_pb2,
    )

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="bench/event.proto",
        package="bench",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"],
    )
    kind = proto.enum_type.add(name="Kind")
    for number, name in enumerate(["VIEW", "CLICK", "BUY"]):
        kind.value.add(name=name, number=number)
    event = proto.message_type.add(name="Event")
    device = event.nested_type.add(name="Device")
    device.field.add(name="os", number=1, type=field.TYPE_STRING)
    device.field.add(name="build", number=2, type=field.TYPE_INT32)
    fields = [
        ("id", field.TYPE_INT64, None, False),
        ("user", field.TYPE_STRING, None, False),
        ("cents", field.TYPE_INT64, None, False),
        ("at", field.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
        ("kind", field.TYPE_ENUM, ".bench.Kind", False),
        ("tags", field.TYPE_STRING, None, True),
        ("note", field.TYPE_MESSAGE, ".google.protobuf.StringValue", False),
        ("score", field.TYPE_DOUBLE, None, False),
        ("ok", field.TYPE_BOOL, None, False),
        ("device", field.TYPE_MESSAGE, ".bench.Event.Device", False),
    ]
    for number, (name, kind_, type_name, repeated) in enumerate(fields, start=1):
        added = event.field.add(name=name, number=number, type=kind_)
        added.label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
        if type_name:
            added.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    for module in (timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))


def event(cls: Any, n: int) -> Any:
    value = cls(
        id=n,
        user=f"user-{n % 10_000:05d}",
        cents=n % 100_000,
        kind=n % 3,
        tags=[f"tag-{n % 17}", f"campaign-{n % 101}", "mobile"][: 1 + n % 3],
        score=n / 7,
        ok=n % 2 == 0,
    )
    value.at.FromMicroseconds(1_795_000_000_000_000 + n * 997)
    if n % 10:
        value.note.value = f"event {n:08d}"
    value.device.os, value.device.build = ("android", "ios", "web")[n % 3], 1000 + n % 500
    return value


def serialized(url: str, cls: Any, count: int) -> list[bytes]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    conf = {"use.deprecated.format": False}
    serializer = ProtobufSerializer(cls, SchemaRegistryClient({"url": url}), conf)
    context = SerializationContext("bench-protobuf", MessageField.VALUE)
    return [serializer(event(cls, n), context) for n in range(count)]


def ingest_decode(values: pa.Array, spec: FramedSpec) -> int:
    rows = 0
    for start in range(0, len(values), WINDOW):
        fields, _good, errors = decode_framed(values.slice(start, WINDOW), spec)
        assert not errors, errors[:3]
        rows += fields.num_rows
    return rows


def message_to_dict(values: list[bytes], cls: Any) -> int:
    from google.protobuf import json_format

    rows = 0
    for start in range(0, len(values), WINDOW):
        records = [
            json_format.MessageToDict(cls.FromString(v[6:]), preserving_proto_field_name=True)
            for v in values[start : start + WINDOW]
        ]
        rows += pa.Table.from_pylist(records).num_rows
    return rows


def upb_columns(values: list[bytes], cls: Any) -> int:
    parse = cls.FromString
    kinds = ["VIEW", "CLICK", "BUY"]
    rows = 0
    for start in range(0, len(values), WINDOW):
        messages = [parse(v[6:]) for v in values[start : start + WINDOW]]
        columns = [
            [m.id for m in messages],
            [m.user for m in messages],
            [m.cents for m in messages],
            [m.at.ToMicroseconds() if m.HasField("at") else None for m in messages],
            [kinds[m.kind] if m.kind < 3 else str(m.kind) for m in messages],
            [list(m.tags) for m in messages],
            [m.note.value if m.HasField("note") else None for m in messages],
            [m.score for m in messages],
            [m.ok for m in messages],
            [
                {"os": m.device.os, "build": m.device.build} if m.HasField("device") else None
                for m in messages
            ],
        ]
        arrays = [pa.array(c, f.type) for c, f in zip(columns, COLUMNS, strict=True)]
        rows += pa.Table.from_arrays(arrays, schema=COLUMNS).num_rows
    return rows


def parse_only(values: list[bytes], cls: Any) -> int:
    parse = cls.FromString
    return sum(1 for v in values if parse(v[6:]) is not None)


def best(repeat: int, run: Any) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - began)
    return min(times), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cls = event_class()
    with SchemaRegistry() as registry:
        began = time.perf_counter()
        values = serialized(registry.url, cls, args.records)
        assert all(v[5] == 0 for v in values)  # message indexes [0]: one zero byte
        mean = sum(len(v) for v in values) / len(values)
        print(
            f"# {args.records:,} values, {mean:.0f} bytes each on average, serialized in "
            f"{time.perf_counter() - began:.1f}s",
            flush=True,
        )
        array = pa.array(values, pa.binary())
        spec = FramedSpec("protobuf", RegistrySettings((registry.url,)), COLUMNS)
        decode_framed(array.slice(0, 10), spec)  # the schema, fetched and cached
        ours, rows = best(args.repeat, lambda: ingest_decode(array, spec))
        assert rows == args.records
    theirs, rows = best(args.repeat, lambda: message_to_dict(values, cls))
    assert rows == args.records
    columns, rows = best(args.repeat, lambda: upb_columns(values, cls))
    assert rows == args.records
    ceiling, rows = best(args.repeat, lambda: parse_only(values, cls))
    assert rows == args.records
    n = args.records
    print(f"ingest decode_framed (ptars)      {ours:7.2f}s  {n / ours:12,.0f} records/s")
    print(f"upb + MessageToDict + from_pylist {theirs:7.2f}s  {n / theirs:12,.0f} records/s")
    print(f"upb + column lists by hand        {columns:7.2f}s  {n / columns:12,.0f} records/s")
    print(f"upb FromString alone (no columns) {ceiling:7.2f}s  {n / ceiling:12,.0f} records/s")
    print(
        f"RESULT records_per_s={n / ours:.0f} vs_message_to_dict={theirs / ours:.2f} "
        f"vs_upb_columns={columns / ours:.2f}"
    )


if __name__ == "__main__":
    main()
