"""What tests/registry/test_protobuf_values.py builds its Protobuf values from: the
``.proto`` files as FileDescriptorProtos (no protoc), their message classes, the orders it
produces, and the reference it checks decoded rows against: protobuf's own reader (upb),
converted to the columns docs/protobuf.md documents by code written apart from ingest's."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import random
from typing import Any

import pyarrow as pa
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

F = descriptor_pb2.FieldDescriptorProto
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


def add_field(message: Any, name: str, number: int, kind: int, **extra: Any) -> Any:
    label = F.LABEL_REPEATED if extra.pop("repeated", False) else F.LABEL_OPTIONAL
    return message.field.add(name=name, number=number, type=kind, label=label, **extra)


def _map(message: Any, name: str, number: int, key: int, value: int, **value_extra: Any) -> None:
    entry = message.nested_type.add(name=name.title() + "Entry")
    entry.options.map_entry = True
    add_field(entry, "key", 1, key)
    add_field(entry, "value", 2, value, **value_extra)
    add_field(
        message, name, number, F.TYPE_MESSAGE, repeated=True, type_name=f".shop.Order.{entry.name}"
    )


def common_file() -> descriptor_pb2.FileDescriptorProto:
    """shop/common.proto, which the order file imports: a reference to its own subject."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop/common.proto", package="shop.common", syntax="proto3"
    )
    money = proto.message_type.add(name="Money")
    add_field(money, "currency", 1, F.TYPE_STRING)
    add_field(money, "cents", 2, F.TYPE_INT64)
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
    add_field(address, "city", 1, F.TYPE_STRING)
    add_field(address, "zip", 2, F.TYPE_INT32)
    line = order.nested_type.add(name="Line")
    add_field(line, "sku", 1, F.TYPE_STRING)
    add_field(line, "price", 2, F.TYPE_MESSAGE, type_name=".shop.common.Money")
    add_field(line, "at", 3, F.TYPE_MESSAGE, repeated=True, type_name=".google.protobuf.Timestamp")
    scalars = [
        ("id", F.TYPE_INT64), ("customer", F.TYPE_INT64 if version >= 3 else F.TYPE_STRING),
        ("qty", F.TYPE_INT32), ("delta", F.TYPE_SINT32), ("code", F.TYPE_SFIXED32),
        ("big", F.TYPE_SINT64), ("fx", F.TYPE_SFIXED64), ("u32", F.TYPE_UINT32),
        ("u64", F.TYPE_UINT64), ("f32", F.TYPE_FIXED32), ("f64", F.TYPE_FIXED64),
        ("ratio", F.TYPE_FLOAT), ("score", F.TYPE_DOUBLE), ("paid", F.TYPE_BOOL),
        ("blob", F.TYPE_BYTES),
    ]  # fmt: skip
    for number, (name, kind) in enumerate(scalars, start=1):
        add_field(order, name, number, kind)
    message = F.TYPE_MESSAGE
    add_field(order, "status", 16, F.TYPE_ENUM, type_name=".shop.Status")
    add_field(order, "placed", 17, message, type_name=".google.protobuf.Timestamp")
    add_field(order, "took", 18, message, type_name=".google.protobuf.Duration")
    add_field(order, "note", 19, message, type_name=".google.protobuf.StringValue")
    add_field(order, "visits", 20, message, type_name=".google.protobuf.UInt64Value")
    add_field(order, "tags", 21, F.TYPE_STRING, repeated=True)
    add_field(order, "address", 22, message, type_name=".shop.Order.Address")
    _map(order, "labels", 23, F.TYPE_STRING, F.TYPE_INT64)
    add_field(order, "lines", 24, message, repeated=True, type_name=".shop.Order.Line")
    order.oneof_decl.add(name="pay")
    add_field(order, "card", 25, F.TYPE_STRING, oneof_index=0)
    add_field(order, "points", 26, F.TYPE_INT64, oneof_index=0)
    order.oneof_decl.add(name="_rating")  # proto3 optional: a synthetic oneof
    add_field(order, "rating", 27, F.TYPE_INT32, oneof_index=1, proto3_optional=True)
    add_field(order, "extra", 28, message, type_name=".google.protobuf.Any")
    add_field(order, "nothing", 29, message, type_name=".google.protobuf.Empty")  # no column
    add_field(order, "nums", 30, F.TYPE_SINT64, repeated=True)  # packed
    _map(order, "prices", 31, F.TYPE_INT32, message, type_name=".shop.common.Money")
    if version >= 2:
        add_field(order, "coupon", 32, F.TYPE_STRING)
    other = proto.message_type.add(name="Other")
    add_field(other, "x", 1, F.TYPE_STRING)
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


def same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return got == want or (math.isnan(got) and math.isnan(want))
    return bool(got == want)


def random_order(cls: Any, generator: random.Random, n: int) -> Message:
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
