"""Protobuf values end to end: message classes built at run time from FileDescriptorProtos
(no protoc), values framed by confluent-kafka's ProtobufSerializer through a real registry
(Apicurio), landed by ``ingest run --until-end`` on Apache Kafka, read back.

Every type family lands as the column docs/protobuf.md names; a second version of the
message with a field more adds its column in the commit of the rows that carry it; a
version whose field changed type, a value of another message of the file, one without
the magic byte and cut ones are dead letters with the reason; every offset lands once.
The decoded values are checked against protobuf's own reader (upb) through the reference
conversion of protobuf_support.py, and what cannot be columns is refused clearly.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
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
from google.protobuf import descriptor_pb2

from ingest.ddl import arrow_schema
from ingest.errors import IncompatibleSchemaError
from ingest.formats.framed import Fit, FramedSpec, decode_framed, fit
from ingest.formats.protobuf.protobuf_values import FORMAT
from ingest.registry import RegistrySettings, client_for
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from tests.registry.protobuf_support import (
    COLUMNS,
    CONF,
    DDL,
    F,
    add_field,
    classes,
    common_file,
    normalized,
    order,
    order_file,
    random_order,
    reference,
    same,
)
from tests.registry.test_avro_values import land, produce

PARTITIONS = 2


# -- tests --------------------------------------------------------------------------------------


def _register(client: SchemaRegistryClient, subject: str, proto: Any, refs: Any = ()) -> int:
    text = base64.b64encode(proto.SerializeToString()).decode()
    return client.register_schema(subject, Schema(text, "PROTOBUF", list(refs)))


def test_columns_of_each_type_family_and_what_is_refused(schema_registry: SchemaRegistry) -> None:
    """The columns of a writer's file: every family as documented (and the same as the
    DDL's), a message by record_name (nested ones too); what cannot be columns refused
    with the reason: recursion (google.protobuf.Struct too), groups, google.type.Date,
    .proto text the registry will not serve serialized, an unknown record_name."""
    client = SchemaRegistryClient(schema_registry.client_conf)
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
    add_field(node, "name", 1, F.TYPE_STRING)
    add_field(node, "children", 2, F.TYPE_MESSAGE, repeated=True, type_name=".t.Node")
    refused(tree, r"recursive message \(t.Node -> children: t.Node\)")
    doc = descriptor_pb2.FileDescriptorProto(
        name="d.proto", package="d", syntax="proto3", dependency=["google/protobuf/struct.proto"]
    )
    add_field(
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
    add_field(
        day.message_type.add(name="Day"), "on", 1, F.TYPE_MESSAGE, type_name=".google.type.Date"
    )
    refused(day, r"google.type.Date is not supported \(the decoder turns an invalid date into 1970")
    legacy = descriptor_pb2.FileDescriptorProto(name="g.proto", package="g", syntax="proto2")
    holder = legacy.message_type.add(name="Holder")
    group = holder.nested_type.add(name="Item")
    add_field(group, "n", 1, F.TYPE_INT32)
    add_field(holder, "item", 1, F.TYPE_GROUP, type_name=".g.Holder.Item")
    refused(legacy, r"g.Holder.item: proto2 groups are not supported")
    # proto2: a required field's column is required (removing it is not legal); the rest not.
    legacy = descriptor_pb2.FileDescriptorProto(name="r.proto", package="r", syntax="proto2")
    kept = legacy.message_type.add(name="Kept")
    kept.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_REQUIRED)
    add_field(kept, "note", 2, F.TYPE_STRING)
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
    client = SchemaRegistryClient(schema_registry.client_conf)
    topic = unique_name("pb-values")
    context = SerializationContext(topic, MessageField.VALUE)
    found = classes(common_file(), order_file(1))
    cls, other = found["shop.Order"], found["shop.Other"]
    serialize = ProtobufSerializer(cls, client, CONF)
    generator = random.Random(20261124)
    messages = [random_order(cls, generator, n) for n in range(400)]
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
            assert same(got[name], want[name]), (position, name, got[name], want[name])
    spec = FramedSpec(
        "protobuf", settings, pa.schema([("x", pa.string())]), record_name="shop.Other"
    )
    table, good, errors = decode_framed(pa.array(values, pa.binary()), spec)
    assert table.column("x").to_pylist() == ["o0", "o1", "o2"]
    assert len(errors) == 400 and "message indexes [0] name shop.Order" in errors[0][1]


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
    client = SchemaRegistryClient(schema_registry.client_conf)
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
    to_v2, to_v3 = ProtobufSerializer(v2, client, CONF), ProtobufSerializer(v3, client, CONF)
    second = [(n % PARTITIONS, to_v2(order(v2, n, coupon=True), context)) for n in range(300, 500)]
    third = [
        (n % PARTITIONS, to_v3(order(v3, n, coupon=True, customer=n), context))
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
