"""Protobuf values end to end: message classes built at run time from FileDescriptorProtos
(no protoc), values framed by confluent-kafka's ProtobufSerializer through a real registry
(Apicurio), landed by ``ingest run --until-end`` on Apache Kafka, read back.

Every type family lands as the column docs/protobuf.md names; a second version of the
message with a field more adds its column in the commit of the rows that carry it; a
version whose field changed type, a value of another message of the file, one without
the magic byte and cut ones are dead letters with the reason; every offset lands once.
The decoded values are checked against protobuf's own reader (upb) through a reference
conversion written here, and the columns of what is refused are refused clearly.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import random
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.type import date_pb2

from ingest.ddl import arrow_schema
from ingest.errors import IncompatibleSchemaError
from ingest.registry import RegistrySettings, client_for
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from spark_jobs.framed import Fit, FramedSpec, decode_framed, fit
from spark_jobs.protobuf import FORMAT
from tests.registry.test_avro_values import land, produce

F = descriptor_pb2.FieldDescriptorProto
PARTITIONS = 2
CONF = {"use.deprecated.format": False}
WELL_KNOWN = (any_pb2, duration_pb2, empty_pb2, struct_pb2, timestamp_pb2, wrappers_pb2, date_pb2)
MONEY = pa.struct([("currency", pa.string()), ("cents", pa.int64())])
TS = pa.timestamp("us", tz="UTC")
U64 = pa.decimal128(20, 0)
# The columns of shop.Order V1, as docs/protobuf.md maps them (all nullable: proto3).
COLUMNS = pa.struct(
    [
        ("id", pa.int64()),
        ("customer", pa.string()),
        ("qty", pa.int32()),
        ("delta", pa.int32()),
        ("code", pa.int32()),
        ("big", pa.int64()),
        ("fx", pa.int64()),
        ("u32", pa.int64()),
        ("u64", U64),
        ("f32", pa.int64()),
        ("f64", U64),
        ("ratio", pa.float32()),
        ("score", pa.float64()),
        ("paid", pa.bool_()),
        ("blob", pa.binary()),
        ("status", pa.string()),
        ("placed", TS),
        ("took", pa.int64()),
        ("note", pa.string()),
        ("visits", U64),
        ("tags", pa.list_(pa.string())),
        ("address", pa.struct([("city", pa.string()), ("zip", pa.int32())])),
        ("labels", pa.map_(pa.string(), pa.int64())),
        ("lines", pa.list_(pa.struct([("sku", pa.string()), ("price", MONEY), ("at", pa.list_(TS))]))),
        ("card", pa.string()),
        ("points", pa.int64()),
        ("rating", pa.int32()),
        ("extra", pa.struct([("type_url", pa.string()), ("value", pa.binary())])),
        ("nums", pa.list_(pa.int64())),
        ("prices", pa.map_(pa.int32(), MONEY)),
    ]
)  # fmt: skip
# The same columns in Spark DDL: the table's value schema in the second run.
DDL = (
    "id BIGINT, customer STRING, qty INT, delta INT, code INT, big BIGINT, fx BIGINT, "
    "u32 BIGINT, u64 DECIMAL(20,0), f32 BIGINT, f64 DECIMAL(20,0), ratio FLOAT, score DOUBLE, "
    "paid BOOLEAN, blob BINARY, status STRING, placed TIMESTAMP, took BIGINT, note STRING, "
    "visits DECIMAL(20,0), tags ARRAY<STRING>, address STRUCT<city: STRING, zip: INT>, "
    "labels MAP<STRING, BIGINT>, lines ARRAY<STRUCT<sku: STRING, price: STRUCT<currency: "
    "STRING, cents: BIGINT>, at: ARRAY<TIMESTAMP>>>, card STRING, points BIGINT, rating INT, "
    "extra STRUCT<type_url: STRING, value: BINARY>, nums ARRAY<BIGINT>, "
    "prices MAP<INT, STRUCT<currency: STRING, cents: BIGINT>>"
)

# -- the .proto files, as descriptors ---------------------------------------------------------


def _field(message: Any, name: str, number: int, kind: int, **extra: Any) -> Any:
    label = F.LABEL_REPEATED if extra.pop("repeated", False) else F.LABEL_OPTIONAL
    return message.field.add(name=name, number=number, type=kind, label=label, **extra)


def _map(message: Any, name: str, number: int, key: int, value: int, **value_extra: Any) -> None:
    entry = message.nested_type.add(name=name.title() + "Entry")
    entry.options.map_entry = True
    _field(entry, "key", 1, key)
    _field(entry, "value", 2, value, **value_extra)
    _field(
        message, name, number, F.TYPE_MESSAGE, repeated=True, type_name=f".shop.Order.{entry.name}"
    )


def common_file() -> descriptor_pb2.FileDescriptorProto:
    """shop/common.proto, which the order file imports: a reference to its own subject."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop/common.proto", package="shop.common", syntax="proto3"
    )
    money = proto.message_type.add(name="Money")
    _field(money, "currency", 1, F.TYPE_STRING)
    _field(money, "cents", 2, F.TYPE_INT64)
    return proto


def order_file(version: int) -> descriptor_pb2.FileDescriptorProto:
    """shop/order.proto: ``Order`` (every type family), then ``Other``. Version 2 adds
    ``coupon``; version 3 also changes ``customer`` from string to int64."""
    wkt = ["timestamp", "duration", "wrappers", "any", "empty"]
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto",
        package="shop",
        syntax="proto3",
        dependency=["shop/common.proto", *(f"google/protobuf/{n}.proto" for n in wkt)],
    )
    status = proto.enum_type.add(name="Status")
    for number, name in enumerate(["NEW", "PAID", "SENT"]):
        status.value.add(name=name, number=number)
    order = proto.message_type.add(name="Order")
    address = order.nested_type.add(name="Address")
    _field(address, "city", 1, F.TYPE_STRING)
    _field(address, "zip", 2, F.TYPE_INT32)
    line = order.nested_type.add(name="Line")
    _field(line, "sku", 1, F.TYPE_STRING)
    _field(line, "price", 2, F.TYPE_MESSAGE, type_name=".shop.common.Money")
    _field(line, "at", 3, F.TYPE_MESSAGE, repeated=True, type_name=".google.protobuf.Timestamp")
    scalars = [
        ("id", F.TYPE_INT64), ("customer", F.TYPE_INT64 if version >= 3 else F.TYPE_STRING),
        ("qty", F.TYPE_INT32), ("delta", F.TYPE_SINT32), ("code", F.TYPE_SFIXED32),
        ("big", F.TYPE_SINT64), ("fx", F.TYPE_SFIXED64), ("u32", F.TYPE_UINT32),
        ("u64", F.TYPE_UINT64), ("f32", F.TYPE_FIXED32), ("f64", F.TYPE_FIXED64),
        ("ratio", F.TYPE_FLOAT), ("score", F.TYPE_DOUBLE), ("paid", F.TYPE_BOOL),
        ("blob", F.TYPE_BYTES),
    ]  # fmt: skip
    for number, (name, kind) in enumerate(scalars, start=1):
        _field(order, name, number, kind)
    message = F.TYPE_MESSAGE
    _field(order, "status", 16, F.TYPE_ENUM, type_name=".shop.Status")
    _field(order, "placed", 17, message, type_name=".google.protobuf.Timestamp")
    _field(order, "took", 18, message, type_name=".google.protobuf.Duration")
    _field(order, "note", 19, message, type_name=".google.protobuf.StringValue")
    _field(order, "visits", 20, message, type_name=".google.protobuf.UInt64Value")
    _field(order, "tags", 21, F.TYPE_STRING, repeated=True)
    _field(order, "address", 22, message, type_name=".shop.Order.Address")
    _map(order, "labels", 23, F.TYPE_STRING, F.TYPE_INT64)
    _field(order, "lines", 24, message, repeated=True, type_name=".shop.Order.Line")
    order.oneof_decl.add(name="pay")
    _field(order, "card", 25, F.TYPE_STRING, oneof_index=0)
    _field(order, "points", 26, F.TYPE_INT64, oneof_index=0)
    order.oneof_decl.add(name="_rating")  # proto3 optional: a synthetic oneof
    _field(order, "rating", 27, F.TYPE_INT32, oneof_index=1, proto3_optional=True)
    _field(order, "extra", 28, message, type_name=".google.protobuf.Any")
    _field(order, "nothing", 29, message, type_name=".google.protobuf.Empty")  # no column
    _field(order, "nums", 30, F.TYPE_SINT64, repeated=True)  # packed
    _map(order, "prices", 31, F.TYPE_INT32, message, type_name=".shop.common.Money")
    if version >= 2:
        _field(order, "coupon", 32, F.TYPE_STRING)
    other = proto.message_type.add(name="Other")
    _field(other, "x", 1, F.TYPE_STRING)
    return proto


def classes(*files: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Message classes by full name, from ``files`` in a pool of their own."""
    pool = descriptor_pool.DescriptorPool()
    for module in WELL_KNOWN:
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    found: dict[str, Any] = {}
    for file in files:
        for message in pool.Add(file).message_types_by_name.values():
            found[message.full_name] = message_factory.GetMessageClass(message)
    return found


def order(cls: Any, n: int, *, coupon: bool = False, customer: Any = None) -> Message:
    """Order number ``n``: every family set, with values past int64, negative times."""
    value = cls(
        id=n,
        customer=customer if customer is not None else f"c{n % 7}",
        qty=n % 50 - 25,
        delta=-n,
        code=-(2**31) + n,
        big=-(2**63) + n,
        fx=2**63 - 1 - n,
        u32=2**32 - 1 - n,
        u64=2**64 - 1 - n,
        f32=n,
        f64=2**63 + n,
        ratio=n / 4,
        score=n / 3,
        paid=n % 2 == 0,
        blob=bytes([n % 256, 0, 255]),
        status=n % 3,
        tags=[f"t{i}" for i in range(n % 3)],
        labels={f"k{i}": i * n for i in range(n % 3)},
        nums=[-n, n, 2**62],
    )
    value.placed.FromMicroseconds(1_790_000_000_000_000 + n * 1_000_001 - 10**16 * (n % 2))
    value.took.FromNanoseconds(-(n * 1_000_500_000) if n % 2 else n * 1_000)
    if n % 3:
        value.note.value = f"note {n}"
    value.visits.value = 0 if n % 2 else 2**64 - 1
    if n % 5:
        value.address.city, value.address.zip = f"city{n % 5}", 10_000 + n
    for i in range(n % 3):
        line = value.lines.add(sku=f"sku{i}")
        line.price.currency, line.price.cents = "EUR", 100 * i - 50
        line.at.add().FromSeconds(n + i)
    if n % 2:
        value.card = f"card{n}"
    elif n % 4:
        value.points = n
    if n % 3 == 0:
        value.rating = 0  # set to its default: present, not null
    value.extra.type_url, value.extra.value = "type.googleapis.com/shop.X", b"\x08\x01"
    value.nothing.SetInParent()
    value.prices[n % 4].cents = n
    if coupon:
        value.coupon = f"C{n}"  # type: ignore[attr-defined]
    return value


# -- the reference: protobuf's own reader, converted to the documented columns -----------------

_WRAPPERS = {
    f"google.protobuf.{k}Value"
    for k in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
_UNSIGNED_64 = (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64)


def reference(message: Message) -> dict[str, Any]:
    """``message`` as its row, by the mapping docs/protobuf.md states."""
    row = {}
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and not field.message_type.fields:
            continue  # an empty message: no column
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            convert = field.message_type.fields_by_name["value"]
            row[field.name] = {k: _scalar(convert, v) for k, v in value.items()}
        elif field.is_repeated:
            row[field.name] = [_scalar(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            row[field.name] = None
        else:
            row[field.name] = _scalar(field, value)
    return row


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    if field.type in _UNSIGNED_64:
        return decimal.Decimal(value)
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return value
    name = field.message_type.full_name
    if name == "google.protobuf.Timestamp":
        micros = value.seconds * 1_000_000 + value.nanos // 1_000
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    if name == "google.protobuf.Duration":
        nanos = value.nanos  # the sign of seconds; microseconds toward zero
        return value.seconds * 1_000_000 + (abs(nanos) // 1_000) * (-1 if nanos < 0 else 1)
    if name in _WRAPPERS:
        inner = value.DESCRIPTOR.fields_by_name["value"]
        return (
            decimal.Decimal(value.value)
            if name.endswith("UInt64Value")
            else _scalar(inner, value.value)
        )
    return reference(value)


def normalized(row: dict[str, Any], columns: pa.StructType) -> dict[str, Any]:
    """A row as read from Arrow, with maps as dicts and times in UTC (as ``reference``)."""
    out = dict(row)
    for field in columns:
        out[field.name] = _normalized(row[field.name], field.type)
    return out


def _normalized(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k: _normalized(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind):
        return [_normalized(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return {f.name: _normalized(value[f.name], f.type) for f in kind}
    if pa.types.is_timestamp(kind):
        return value.astimezone(dt.UTC)
    return value


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return got == want or (math.isnan(got) and math.isnan(want))
    return bool(got == want)


# -- tests --------------------------------------------------------------------------------------


def _register(client: SchemaRegistryClient, subject: str, proto: Any, refs: Any = ()) -> int:
    text = base64.b64encode(proto.SerializeToString()).decode()
    return client.register_schema(subject, Schema(text, "PROTOBUF", list(refs)))


def test_columns_of_each_type_family_and_what_is_refused(schema_registry: SchemaRegistry) -> None:
    """The columns of a writer's file: every family as documented (and the same as the
    DDL's), a message by record_name (nested ones too); what cannot be columns refused
    with the reason: recursion (google.protobuf.Struct too), groups, google.type.Date,
    .proto text the registry will not serve serialized, an unknown record_name."""
    client = SchemaRegistryClient({"url": schema_registry.url})
    ours = client_for(RegistrySettings((schema_registry.url,)))
    topic = unique_name("pb-columns")
    found = classes(common_file(), order_file(1))
    serializer = ProtobufSerializer(found["shop.Order"], client, CONF)
    serializer(order(found["shop.Order"], 1), SerializationContext(topic, MessageField.VALUE))
    latest = ours.latest(f"{topic}-value")
    assert FORMAT.columns(latest, ours, None) == COLUMNS
    # The DDL names the same columns: nothing to add, nothing that does not fit.
    ddl = arrow_schema(DDL)
    assert ddl is not None and fit(COLUMNS, ddl) == Fit(added=(), problems=())
    assert FORMAT.columns(latest, ours, "shop.Other") == pa.struct([("x", pa.string())])
    nested = FORMAT.columns(latest, ours, "shop.Order.Address")
    assert nested == pa.struct([("city", pa.string()), ("zip", pa.int32())])
    with pytest.raises(
        IncompatibleSchemaError, match=r"no message 'shop.Nope'.*shop.Order, shop.Other"
    ):
        FORMAT.columns(latest, ours, "shop.Nope")

    def refused(proto: Any, match: str) -> None:
        schema_id = _register(client, unique_name("pb-refused"), proto)
        with pytest.raises(IncompatibleSchemaError, match=match):
            FORMAT.columns(ours.schema(schema_id), ours, None)

    tree = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    node = tree.message_type.add(name="Node")
    _field(node, "name", 1, F.TYPE_STRING)
    _field(node, "children", 2, F.TYPE_MESSAGE, repeated=True, type_name=".t.Node")
    refused(tree, r"recursive message \(t.Node -> children: t.Node\)")
    doc = descriptor_pb2.FileDescriptorProto(
        name="d.proto", package="d", syntax="proto3", dependency=["google/protobuf/struct.proto"]
    )
    _field(
        doc.message_type.add(name="Doc"),
        "body",
        1,
        F.TYPE_MESSAGE,
        type_name=".google.protobuf.Struct",
    )
    refused(
        doc, r"recursive message \(d.Doc -> body: google.protobuf.Struct -> .*google.protobuf.Value"
    )
    day = descriptor_pb2.FileDescriptorProto(
        name="y.proto", package="y", syntax="proto3", dependency=["google/type/date.proto"]
    )
    _field(day.message_type.add(name="Day"), "on", 1, F.TYPE_MESSAGE, type_name=".google.type.Date")
    refused(day, r"google.type.Date is not supported \(the decoder turns an invalid date into 1970")
    legacy = descriptor_pb2.FileDescriptorProto(name="g.proto", package="g", syntax="proto2")
    holder = legacy.message_type.add(name="Holder")
    group = holder.nested_type.add(name="Item")
    _field(group, "n", 1, F.TYPE_INT32)
    _field(holder, "item", 1, F.TYPE_GROUP, type_name=".g.Holder.Item")
    refused(legacy, r"g.Holder.item: proto2 groups are not supported")
    # proto2: a required field's column is required (removing it is not legal); the rest not.
    legacy = descriptor_pb2.FileDescriptorProto(name="r.proto", package="r", syntax="proto2")
    kept = legacy.message_type.add(name="Kept")
    kept.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_REQUIRED)
    _field(kept, "note", 2, F.TYPE_STRING)
    schema_id = _register(client, unique_name("pb-proto2"), legacy)
    columns = FORMAT.columns(ours.schema(schema_id), ours, None)
    assert columns == pa.struct([pa.field("id", pa.int64(), nullable=False), ("note", pa.string())])
    # .proto text: Apicurio keeps it as text and serves format=serialized as the
    # descriptor's bytes decoded as UTF-8 (not base64): refused, saying what ingest needs.
    text = 'syntax = "proto3";\npackage p;\nmessage P {\n  int64 id = 1;\n}\n'
    request = urllib.request.Request(
        f"{schema_registry.url}/subjects/{unique_name('pb-text')}/versions",
        data=json.dumps({"schema": text, "schemaType": "PROTOBUF"}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text_id = int(json.load(answer)["id"])
    assert ours.schema(text_id).text == text
    with pytest.raises(
        IncompatibleSchemaError, match=r"schema id \d+ as .proto text.*format=serialized"
    ):
        FORMAT.columns(ours.schema(text_id), ours, None)


def test_decoded_values_match_protobufs_own_reader(schema_registry: SchemaRegistry) -> None:
    """Random Orders (extreme integers, NaN and infinities, unicode, empty and absent
    fields, negative times, fields set to their defaults) decode to what upb reads,
    converted by the documented mapping; a value of another message of the file is a
    dead letter naming it, and record_name turns the table to that message."""
    client = SchemaRegistryClient({"url": schema_registry.url})
    topic = unique_name("pb-values")
    context = SerializationContext(topic, MessageField.VALUE)
    found = classes(common_file(), order_file(1))
    cls, other = found["shop.Order"], found["shop.Other"]
    serialize = ProtobufSerializer(cls, client, CONF)
    generator = random.Random(20261124)
    messages = [_random_order(cls, generator, n) for n in range(400)]
    values: list[bytes | None] = [serialize(m, context) for m in messages]
    others = [ProtobufSerializer(other, client, CONF)(other(x=f"o{i}"), context) for i in range(3)]
    values[10:10] = others  # positions 10, 11, 12
    settings = RegistrySettings((schema_registry.url,))
    schema = pa.schema(list(COLUMNS))
    table, good, errors = decode_framed(
        pa.array(values, pa.binary()), FramedSpec("protobuf", settings, schema)
    )
    assert [i for i, _ in errors] == [10, 11, 12]
    assert errors[0][1] == (
        "undecodable Protobuf payload: ValueError: message indexes [1] name shop.Other, not the "
        "table's message shop.Order (the file's first; schema_registry.record_name chooses another)"
    )
    assert len(good) == table.num_rows == 400
    decode = ProtobufDeserializer(cls, CONF)
    for position, row in zip(good, table.to_pylist(), strict=True):
        want = reference(decode(values[position], context))
        got = normalized(row, COLUMNS)
        for name in want:
            assert _same(got[name], want[name]), (position, name, got[name], want[name])
    spec = FramedSpec(
        "protobuf", settings, pa.schema([("x", pa.string())]), record_name="shop.Other"
    )
    table, good, errors = decode_framed(pa.array(values, pa.binary()), spec)
    assert table.column("x").to_pylist() == ["o0", "o1", "o2"]
    assert len(errors) == 400 and "message indexes [0] name shop.Order" in errors[0][1]


def _random_order(cls: Any, generator: random.Random, n: int) -> Message:
    pick = generator.choice
    text = "".join(pick("aé€😀 \n\x00z") for _ in range(generator.randrange(6)))
    value = cls(
        id=pick([0, -1, 2**63 - 1, -(2**63), n]),
        customer=text,
        qty=pick([0, 2**31 - 1, -(2**31)]),
        delta=pick([0, -1, 2**31 - 1]),
        code=pick([-(2**31), 7]),
        big=pick([-(2**63), 2**63 - 1, 0]),
        fx=pick([-1, 2**63 - 1]),
        u32=pick([0, 2**32 - 1, 2**31]),
        u64=pick([0, 2**64 - 1, 2**63]),
        f32=pick([0, 2**32 - 1]),
        f64=pick([0, 2**64 - 1]),
        ratio=pick([0.0, -0.5, float("inf"), float("nan"), 3.4e38]),
        score=pick([0.0, float("-inf"), float("nan"), 5e-324, -1e308]),
        paid=pick([True, False]),
        blob=bytes(generator.randrange(256) for _ in range(generator.randrange(4))),
        status=pick([0, 1, 2, 7]),  # 7: no symbol (proto3 enums are open)
        tags=[text] * generator.randrange(3),
        labels={f"{text}{i}": generator.randrange(-5, 5) for i in range(generator.randrange(3))},
        nums=[generator.randrange(-(2**63), 2**63) for _ in range(generator.randrange(4))],
    )
    if pick([True, False]):
        value.placed.seconds = generator.randrange(-62135596800, 253402300799)
        value.placed.nanos = generator.randrange(10**9)
    if pick([True, False]):
        value.took.seconds = generator.randrange(-(10**11), 10**11)
        value.took.nanos = generator.randrange(10**9) * (-1 if value.took.seconds < 0 else 1)
    for wrapper, choices in (("note", ["", text]), ("visits", [0, 2**64 - 1])):
        if pick([True, False]):
            getattr(value, wrapper).value = pick(choices)  # a default: present, not null
    if pick([True, False]):
        value.address.SetInParent()  # present, every field at its default
        if pick([True, False]):
            value.address.city = text
    for _ in range(generator.randrange(3)):
        line = value.lines.add(sku=text)
        if pick([True, False]):
            line.price.cents = generator.randrange(-(2**40), 2**40)
        line.at.add().seconds = generator.randrange(0, 2**32)
    choice = generator.randrange(3)
    if choice == 1:
        value.card = text
    elif choice == 2:
        value.points = 0
    if pick([True, False]):
        value.rating = generator.randrange(-2, 2)
    if pick([True, False]):
        value.extra.type_url = text
    for _ in range(generator.randrange(3)):
        value.prices[generator.randrange(-(2**31), 2**31)].currency = text
    return value


def test_protobuf_values_land_evolve_and_bad_ones_are_dead_letters(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    """Run 1 (columns from the subject's latest schema): every family lands as
    documented; values without the magic byte, cut short, or of the file's other message
    are dead letters. Run 2 (the DDL of those columns): version 2's new field is a column
    added in the commit of its first rows; version 3 (customer string -> int64) is dead
    letters naming its schema id. Every offset lands once."""
    topic = unique_name("protobuf")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = classes(common_file(), order_file(1))
    serialize = ProtobufSerializer(v1["shop.Order"], client, CONF)
    first = [(n % PARTITIONS, serialize(order(v1["shop.Order"], n), context)) for n in range(300)]
    good = first[7][1]
    assert good is not None
    decode = ProtobufDeserializer(v1["shop.Order"], CONF)
    with pytest.raises(Exception, match="Error parsing message"):
        decode(good[:-1], context)  # cut inside its last field: protobuf cannot read it
    other = ProtobufSerializer(v1["shop.Other"], client, CONF)(v1["shop.Other"](x="o"), context)
    bad: list[tuple[int, bytes | None]] = [
        (0, b"\x01" + good[1:]),  # not the magic byte
        (1, good[:3]),  # shorter than the header
        (0, good[:-1]),  # cut inside the message
        (1, other),  # the file's other message
    ]
    produce(broker.bootstrap, topic, first + bad)
    registry = {"urls": [schema_registry.url]}
    cfg = land(broker, tmp_path, topic, {"format": "protobuf"}, registry)
    table = DeltaTable(cfg.table.uri)
    have = {f.name: json.loads(f.to_json())["type"] for f in table.schema().fields}
    for want in DeltaSchema.from_arrow(pa.schema(list(COLUMNS))).fields:
        assert have[want.name] == json.loads(want.to_json())["type"], want.name
    assert "nothing" not in have  # google.protobuf.Empty: no column
    rows = {row["id"]: row for row in table.to_pyarrow_table().to_pylist()}
    assert len(rows) == 300
    for n in (0, 1, 2, 3, 150, 299):
        want = reference(decode(first[n][1], context))
        assert normalized(rows[n], COLUMNS) | want == normalized(rows[n], COLUMNS), n
    assert rows[1]["u64"] == decimal.Decimal(2**64 - 2) and rows[1]["took"] == -1_000_500
    assert rows[1]["placed"] == dt.datetime(1709, 11, 1, 20, 26, 41, 1, tzinfo=dt.UTC)
    assert (rows[0]["rating"], rows[1]["rating"], rows[0]["card"], rows[2]["points"]) == (
        0,
        None,
        None,
        2,
    )
    assert (rows[1]["status"], rows[1]["note"], rows[3]["note"]) == ("PAID", "note 1", None)
    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    by_value = {row["value"]: row for row in dead}
    assert len(dead) == len(bad) and all(row["topic"] == topic for row in dead)
    assert "magic byte 1" in by_value[bad[0][1]]["error_message"]
    assert "fewer than 5" in by_value[bad[1][1]]["error_message"]
    assert "undecodable Protobuf payload" in by_value[bad[2][1]]["error_message"]
    assert "message indexes [1] name shop.Other" in by_value[other]["error_message"]
    # Version 2 (one field more) and version 3 (customer: string -> int64) of the message.
    v2 = classes(common_file(), order_file(2))["shop.Order"]
    v3 = classes(common_file(), order_file(3))["shop.Order"]
    client.set_compatibility(subject_name=f"{topic}-value", level="NONE")
    second = [
        (n % PARTITIONS, ProtobufSerializer(v2, client, CONF)(order(v2, n, coupon=True), context))
        for n in range(300, 500)
    ]
    third = [
        (
            n % PARTITIONS,
            ProtobufSerializer(v3, client, CONF)(order(v3, n, coupon=True, customer=n), context),
        )
        for n in range(500, 520)
    ]
    produce(broker.bootstrap, topic, second + third)
    before = table.version()
    cfg = land(
        broker,
        tmp_path,
        topic,
        {"format": "protobuf", "schema": DDL},
        registry,
        group=cfg.source.group_id,
    )
    verdict = verify_exact(
        broker.bootstrap,
        topic,
        cfg.source.group_id,
        cfg.table.uri,
        dead_letter_uri=cfg.dead_letter_uri(),
    )
    verdict.raise_if_not_exact()
    assert verdict.dead_letters == len(bad) + len(third)
    # The first commit whose schema has coupon holds the rows that carry it.
    table = DeltaTable(cfg.table.uri)
    added = next(
        v
        for v in range(before + 1, table.version() + 1)
        if "coupon" in [f.name for f in DeltaTable(cfg.table.uri, version=v).schema().fields]
    )
    log = Path(cfg.table.uri, "_delta_log", f"{added:020d}.json").read_text().splitlines()
    actions = [next(iter(json.loads(line))) for line in log]
    assert "metaData" in actions and "add" in actions, actions
    at_added = DeltaTable(cfg.table.uri, version=added).to_pyarrow_table()
    assert at_added.num_rows > 300 and at_added.column("coupon").drop_null().to_pylist()
    rows = {row["id"]: row for row in table.to_pyarrow_table().to_pylist()}
    assert len(rows) == 500 and rows[0]["coupon"] is None and rows[499]["coupon"] == "C499"
    v3_id = int.from_bytes(third[0][1][1:5], "big")  # type: ignore[index]
    reasons = [
        row["error_message"]
        for row in DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
        if row["value"] in {value for _, value in third}
    ]
    assert len(reasons) == len(third)
    assert all(
        f"schema id {v3_id} does not fit the table: customer: int64 where the table has string" in r
        for r in reasons
    ), reasons[:2]
