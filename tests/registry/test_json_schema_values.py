"""JSON Schema values: produced by confluent-kafka's JSONSerializer through a real registry
(Apicurio), mapped to columns, checked, landed by ``ingest run --until-end`` on Apache
Kafka and read back.

The writer's JSON Schema gives the columns (docs/json_schema.md); a value whose JSON does
not fit its own writer's schema (a wrong JSON type, a required property missing, a
date-time without its offset) is a dead letter naming the JSON pointer; a second version
of the subject with a property more adds its column in the commit of the rows that carry
it; a version that changes a property's type dead-letters its records naming the schema
id; every offset ends in one table, once.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from ingest.config import IngestConfig, load_config
from ingest.engines.local.local_engine import LocalEngine
from ingest.errors import IncompatibleSchemaError
from ingest.formats.framed import FramedSpec, decode_framed, format_of
from ingest.registry import RegistryClient, RegistrySettings
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, SchemaRegistry, create_topic, unique_name, verify_exact
from tests.runtime.support import write_config

PARTITIONS = 2
DRAFT = "http://json-schema.org/draft-07/schema#"
UTC = dt.UTC
TIMESTAMP = pa.timestamp("us", tz="UTC")

ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}}
V1: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "Order",
    "type": "object",
    "definitions": {"address": ADDRESS},
    "$defs": {
        "line": {
            "type": "object",
            "properties": {
                "sku": {"type": "string"},
                "qty": {"type": "integer"},
                "at": {"type": "string", "format": "date-time"},
            },
            "required": ["sku", "qty"],
        }
    },
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "placed": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "status": {"type": "string", "enum": ["NEW", "PAID", "SENT"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["null", "string"]},
        "address": {"$ref": "#/definitions/address"},
        "billing": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/address"}]},
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
    },
    "required": ["id", "customer", "placed", "address"],
    # A closed content model: a property added later is BACKWARD compatible (to an open
    # one it is not: old values may hold it with any type).
    "additionalProperties": False,
}  # fmt: skip
# One optional property more: a map (its values go a record at a time).
V2: dict[str, Any] = {
    **V1,
    "properties": {
        **V1["properties"],
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}
# A property's type changed: not a column of the table's any more.
V3: dict[str, Any] = {**V1, "properties": {**V1["properties"], "amount": {"type": "string"}}}

ADDRESS_TYPE = pa.struct([("city", pa.string()), ("zip", pa.int64())])
# Nested fields are nullable, required or not (the values are checked).
LINE_TYPE = pa.struct([("sku", pa.string()), ("qty", pa.int64()), ("at", TIMESTAMP)])
V1_COLUMNS = pa.struct(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("customer", pa.string(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("paid", pa.bool_()),
        pa.field("placed", TIMESTAMP, nullable=False),
        pa.field("day", pa.date32()),
        pa.field("status", pa.string()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("note", pa.string()),
        pa.field("address", ADDRESS_TYPE, nullable=False),
        pa.field("billing", ADDRESS_TYPE),
        pa.field("lines", pa.list_(LINE_TYPE)),
    ]
)
# V1's columns in Spark DDL (the second run's table.value.schema).
V1_DDL = (
    "id BIGINT, customer STRING, amount DOUBLE, paid BOOLEAN, placed TIMESTAMP, day DATE, "
    "status STRING, tags ARRAY<STRING>, note STRING, address STRUCT<city: STRING, zip: BIGINT>, "
    "billing STRUCT<city: STRING, zip: BIGINT>, "
    "lines ARRAY<STRUCT<sku: STRING, qty: BIGINT, at: TIMESTAMP>>"
)
OFFSETS = [0, 120, -330, 0]  # minutes east of UTC, by n % 4 (n % 4 == 0 written "Z")


def placed(n: int) -> dt.datetime:
    return dt.datetime(2026, 11, 1, tzinfo=UTC) + dt.timedelta(
        seconds=n, microseconds=n * 7_919 % 1_000_000
    )


def placed_text(n: int) -> str:
    """``placed(n)`` in RFC 3339 at one of several offsets; every fifth with nanoseconds
    (digits past the microsecond, which the column drops)."""
    local = placed(n).astimezone(dt.timezone(dt.timedelta(minutes=OFFSETS[n % 4])))
    text = local.isoformat(timespec="microseconds")
    if n % 5 == 0:
        text = text[:26] + "789" + text[26:]
    return text[:-6] + "Z" if n % 4 == 0 else text


def order(n: int) -> dict[str, Any]:
    value: dict[str, Any] = {
        "id": n,
        "customer": f"c{n % 7}",
        "amount": n * 1.25,
        "paid": n % 2 == 0,
        "placed": placed_text(n),
        "day": (dt.date(2026, 11, 1) + dt.timedelta(days=n % 30)).isoformat(),
        "status": ["NEW", "PAID", "SENT"][n % 3],
        "tags": [f"t{i}" for i in range(n % 4)],
        "note": None if n % 2 else f"note {n}",
        "address": {"city": f"city{n % 5}"} if n % 7 == 0 else {"city": "x", "zip": 10_000 + n},
        "lines": [{"sku": f"s{n}-{i}", "qty": i, "at": placed_text(n + i)} for i in range(n % 3)],
    }
    if n % 3 == 1:
        value["billing"] = None
    elif n % 3 == 2:
        value["billing"] = {"city": f"b{n}"}
    return value


def expected_row(n: int) -> dict[str, Any]:
    """``order(n)`` as the table holds it."""
    value = order(n)
    at = placed(n)
    return {
        **value,
        "placed": at,
        "day": dt.date.fromisoformat(value["day"]),
        "address": {"zip": None, **value["address"]},
        "billing": {"zip": None, **value["billing"]} if value.get("billing") else None,
        "lines": [
            {"sku": line["sku"], "qty": line["qty"], "at": placed(n + line["qty"])}
            for line in value["lines"]
        ],
    }


def produce(bootstrap: str, topic: str, values: list[tuple[int, bytes | None]]) -> list[int]:
    """Produces each (partition, value) in order; the offset each got."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    offsets: list[int] = [-1] * len(values)

    def delivered(index: int) -> Any:
        def report(error: Any, message: Any) -> None:
            assert error is None, error
            offsets[index] = message.offset()

        return report

    for i, (partition, value) in enumerate(values):
        producer.produce(topic, value, b"k", partition, on_delivery=delivered(i))
    assert producer.flush(30) == 0
    return offsets


def serializer(
    registry: SchemaRegistry, schema: dict[str, Any] | Schema, *, validate: bool = True
) -> JSONSerializer:
    text = schema if isinstance(schema, Schema) else json.dumps(schema)
    client = SchemaRegistryClient(registry.client_conf)
    return JSONSerializer(text, client, conf={"validate": validate})


def land(
    broker: KafkaCluster, tmp_path: Path, topic: str, group: str, value: dict[str, Any],
    registry: SchemaRegistry,
) -> IngestConfig:  # fmt: skip
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"table": {"value": value}, "schema_registry": {"urls": [registry.url]}},
    )
    cfg = load_config(path)
    engine = group_run(cfg, until_end=True)
    assert isinstance(engine.lander, LocalEngine)  # decoded in the local engine's task processes
    outcome = engine.run()
    assert outcome.exit_code == 0, outcome.message
    return cfg


def test_json_schema_values_land_as_columns_evolve_and_bad_ones_are_dead_letters(
    broker: KafkaCluster, schema_registry: SchemaRegistry, tmp_path: Path
) -> None:
    topic, group = unique_name("jsonschema"), unique_name("g")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = serializer(schema_registry, V1)
    lax = serializer(schema_registry, V1, validate=False)  # what a careless producer sends
    good = [(n % PARTITIONS, v1(order(n), context)) for n in range(600)]
    wrong = {
        "/id": {**order(1), "id": "1"},
        "/customer": {k: v for k, v in order(2).items() if k != "customer"},
        "/address/zip": {**order(3), "address": {"city": "x", "zip": "12345"}},
        "/tags/0": {**order(4), "tags": [1]},
        "/amount": {**order(5), "amount": True},
        "/lines/0/qty": {**order(5), "lines": [{"sku": "s", "qty": 1.0}]},
    }
    invalid = [(0, lax(value, context)) for value in wrong.values()]
    # The serializer's validation does not check formats: this one passes it.
    invalid.append((1, v1({**order(6), "placed": "2026-11-01T10:00:00"}, context)))
    sample = good[0][1]
    assert sample is not None and sample[0] == 0 and sample[5:6] == b"{"
    corrupt: list[tuple[int, bytes | None]] = [
        (0, b"\x01" + sample[1:]),  # not the magic byte
        (1, sample[:3]),  # shorter than the header
        (1, sample[:-9]),  # the JSON cut short
    ]
    bad = invalid + corrupt
    offsets = produce(broker.bootstrap, topic, good + bad)
    bad_at = {(p, o) for (p, _), o in zip(bad, offsets[len(good) :], strict=True)}

    # Run 1: no DDL, so the columns are the subject's latest schema, V1.
    cfg = land(broker, tmp_path, topic, group, {"format": "json_schema"}, schema_registry)
    table = DeltaTable(cfg.table.uri).to_pyarrow_table()
    assert table.num_rows == 600
    for i in range(V1_COLUMNS.num_fields):
        column = V1_COLUMNS.field(i)
        assert table.schema.field(column.name).type == column.type, column.name
    rows = {row["id"]: row for row in table.to_pylist()}
    for n in (0, 1, 2, 3, 5, 7, 14, 599):
        got, want = rows[n], expected_row(n)
        for name in V1["properties"]:
            assert got[name] == want.get(name), (n, name, got[name], want.get(name))
    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    assert {(row["partition"], row["offset"]) for row in dead} == bad_at
    assert all(row["topic"] == topic and row["value"] is not None for row in dead)
    reasons = sorted(str(row["error_message"]) for row in dead)
    for pointer in [*wrong, "/placed"]:
        assert any(f": {pointer}: " in r for r in reasons), (pointer, reasons)
    assert any("/placed: '2026-11-01T10:00:00' is not an RFC 3339" in r for r in reasons)
    assert any("magic byte 1" in r for r in reasons), reasons
    assert any("fewer than 5" in r for r in reasons), reasons
    assert any("invalid JSON" in r for r in reasons), reasons

    # Run 2 (the same group): V2 adds a property, V3 changes one's type.
    v2 = serializer(schema_registry, V2)  # BACKWARD compatible: the registry takes it
    evolved = [
        (n % PARTITIONS, v2({**order(n), "labels": {f"k{i}": i for i in range(n % 3)}}, context))
        for n in range(600, 900)
    ]
    client = SchemaRegistryClient(schema_registry.client_conf)
    client.set_compatibility(f"{topic}-value", "NONE")  # V3 is not
    v3 = serializer(schema_registry, V3)
    changed = [
        (n % PARTITIONS, v3({**order(n), "amount": f"{n}.00"}, context)) for n in range(900, 1000)
    ]
    v3_id = client.get_latest_version(f"{topic}-value").schema_id
    offsets = produce(broker.bootstrap, topic, evolved + changed)
    changed_at = {(p, o) for (p, _), o in zip(changed, offsets[len(evolved) :], strict=True)}
    cfg = land(
        broker, tmp_path, topic, group, {"format": "json_schema", "schema": V1_DDL}, schema_registry
    )
    verdict = verify_exact(
        broker.bootstrap, topic, group, cfg.table.uri, dead_letter_uri=cfg.dead_letter_uri()
    )
    verdict.raise_if_not_exact()
    assert (verdict.rows, verdict.dead_letters) == (900, len(bad) + len(changed))
    table = DeltaTable(cfg.table.uri).to_pyarrow_table()
    assert table.schema.field("labels").type == pa.map_(pa.string(), pa.int64())
    labels = {row["id"]: row["labels"] for row in table.select(["id", "labels"]).to_pylist()}
    assert labels[0] is None  # a V1 record
    assert labels[602] == [("k0", 0), ("k1", 1)]
    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().to_pylist()
    refused = [row for row in dead if (row["partition"], row["offset"]) in changed_at]
    assert len(refused) == len(changed)
    why = f"schema id {v3_id} does not fit the table: amount: string where the table has double"
    assert all(why in str(row["error_message"]) for row in refused), refused[0]["error_message"]
    # The column came in the commit of the first rows carrying it: that commit's metaData
    # action sits beside its add actions, and no earlier version knew the column.
    commits = sorted((tmp_path / "table" / "_delta_log").glob("*.json"))
    actions = [[json.loads(line) for line in path.read_text().splitlines()] for path in commits]
    first = next(i for i, acts in enumerate(actions) if _has_column(acts, "labels"))
    assert not any(_has_column(acts, "labels") for acts in actions[:first])
    adds = [a["add"]["path"] for a in actions[first] if "add" in a]
    assert adds and any("txn" in a for a in actions[first])
    carried = pa.concat_tables(
        [pq.read_table(tmp_path / "table" / path, columns=["labels"]) for path in adds]
    )
    assert carried.column("labels").null_count < carried.num_rows


def _has_column(actions: list[dict[str, Any]], name: str) -> bool:
    return any(
        name in [f["name"] for f in json.loads(a["metaData"]["schemaString"])["fields"]]
        for a in actions
        if "metaData" in a
    )


def test_schemas_map_to_columns_and_what_cannot_is_refused_naming_the_pointer(
    schema_registry: SchemaRegistry,
) -> None:
    """Every type family, $ref in the document and to another subject (a registry
    reference), and the schemas no column can hold."""
    client = SchemaRegistryClient(schema_registry.client_conf)
    ours = RegistryClient(RegistrySettings((schema_registry.url,)))
    subject = unique_name("js-map")
    point = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    client.register_schema(f"{subject}-point", Schema(json.dumps(point), "JSON"))
    schema = {
        "$schema": DRAFT,
        "type": "object",
        "$defs": {"tag": {"enum": ["a", "b", None]}},
        "properties": {
            "n": {"type": "integer"},
            "f": {"type": ["number", "null"]},
            "ok": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
            "s": {"type": "string", "format": "uuid"},
            "kind": {"const": "order"},
            "tag": {"$ref": "#/$defs/tag"},
            "at": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "where": {"$ref": "point.json"},
            "x": {"$ref": "point.json#/properties/x"},
            "path": {"type": "array", "items": {"$ref": "point.json"}},
            "one": {  # a oneOf that only constrains: the properties give the type
                "type": "object",
                "properties": {"a": {"type": "string"}, "b/c": {"type": "string"}},
                "oneOf": [{"required": ["a"]}, {"required": ["b/c"]}],
            },
        },
        "required": ["n", "f", "where"],
    }
    reference = SchemaReference("point.json", f"{subject}-point", 1)
    schema_id = client.register_schema(
        f"{subject}-value", Schema(json.dumps(schema), "JSON", [reference])
    )
    point_type = pa.struct([("x", pa.float64())])  # required, but nested
    columns = format_of("json_schema").columns(ours.schema(schema_id), ours, None)
    assert columns == pa.struct(
        [
            pa.field("n", pa.int64(), nullable=False),
            pa.field("f", pa.float64()),  # required, but null is one of its values
            pa.field("ok", pa.bool_()),
            pa.field("s", pa.string()),
            pa.field("kind", pa.string()),
            pa.field("tag", pa.string()),
            pa.field("at", TIMESTAMP),
            pa.field("day", pa.date32()),
            pa.field("counts", pa.map_(pa.string(), pa.int64())),
            pa.field("where", point_type, nullable=False),
            pa.field("x", pa.float64()),
            pa.field("path", pa.list_(point_type)),
            pa.field("one", pa.struct([("a", pa.string()), ("b/c", pa.string())])),
        ]
    )
    # A reference named by its full URL, a $ref relative to the schema's $id.
    based = {
        "$schema": DRAFT,
        "$id": "https://example.com/schemas/route.json",
        "type": "object",
        "properties": {"to": {"$ref": "point.json"}},
    }
    full = SchemaReference("https://example.com/schemas/point.json", f"{subject}-point", 1)
    based_id = client.register_schema(f"{subject}-based", Schema(json.dumps(based), "JSON", [full]))
    based_columns = format_of("json_schema").columns(ours.schema(based_id), ours, None)
    assert based_columns == pa.struct([("to", point_type)])
    refused = {
        '#/properties/u: type ["string", "integer"]': {
            "properties": {"u": {"type": ["string", "integer"]}}
        },
        "#/properties/u: oneOf of 2 non-null schemas": {
            "properties": {"u": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}
        },
        "#/definitions/node/properties/next: $ref '#/definitions/node' is recursive": {
            "definitions": {
                "node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/node"}}}
            },
            "properties": {"head": {"$ref": "#/definitions/node"}},
        },
        "#/properties/o: an object with neither properties": {
            "properties": {"o": {"type": "object"}}
        },
        "#/properties/a: an array with no items schema": {"properties": {"a": {"type": "array"}}},
        "#/properties/r: a $ref to the document 'other.json', which no reference": {
            "properties": {"r": {"$ref": "other.json"}}
        },
        "#/properties/any: a schema with no type": {"properties": {"any": {}}},
    }
    for message, body in refused.items():
        text = json.dumps({"$schema": DRAFT, "type": "object", **body})
        refused_id = client.register_schema(unique_name("js-bad"), Schema(text, "JSON"))
        with pytest.raises(IncompatibleSchemaError) as caught:
            format_of("json_schema").columns(ours.schema(refused_id), ours, None)
        assert message in str(caught.value), (message, str(caught.value))


UNIT_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT,
    "type": "object",
    "properties": {
        "at": {"type": "string", "format": "date-time"},
        "box": {
            "type": "object",
            "properties": {"w": {"type": "integer"}, "on": {"type": "string", "format": "date"}},
            "required": ["w"],
        },
        "xs": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["at"],
}  # fmt: skip
AT = [
    "2026-11-01T10:00:00+02:00",
    "2026-11-01T10:00:00Z",
    "2026-11-01t10:00:00.5z",
    "2026-11-01 10:00:00.123456789-05:30",
    "1969-12-31T23:59:59.999999+00:00",
]
INSTANTS = [
    dt.datetime(2026, 11, 1, 8, tzinfo=UTC),
    dt.datetime(2026, 11, 1, 10, tzinfo=UTC),
    dt.datetime(2026, 11, 1, 10, 0, 0, 500_000, tzinfo=UTC),
    dt.datetime(2026, 11, 1, 15, 30, 0, 123_456, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
]
# The first thing wrong in each value (its JSON pointer and why) -> the value.
WRONG: dict[str, Any] = {
    "/box/w: required": {"at": AT[1], "box": {"on": "2026-01-01"}},
    "/xs/1: a number where the schema says integer": {"at": AT[1], "xs": [1, 2.5]},
    "/xs/0: null where the schema says integer": {"at": AT[1], "xs": [None]},
    "/xs/0: 3.0: an integer must be written as one (no fraction, no exponent)": {"at": AT[1], "xs": [3.0]},
    "/xs: a string where the schema says array": {"at": AT[1], "xs": "1"},
    "/box/on: '2026-1-1' is not a full date": {"at": AT[1], "box": {"w": 1, "on": "2026-1-1"}},
    "/at: '2026-11-01T10:00:00' is not an RFC 3339": {"at": "2026-11-01T10:00:00"},
    "/at: not a date-time Arrow reads": {"at": "2026-02-30T10:00:00Z"},
    "/at: required": {"box": None},
    "/: an array where the schema says object": [1],
}  # fmt: skip


@pytest.mark.parametrize("route", ["arrow", "record"])
def test_values_are_checked_against_their_schema_and_instants_are_utc(
    schema_registry: SchemaRegistry, route: str
) -> None:
    """Straight through the frame (no broker), on both routes (a map in the schema
    sends its values a record at a time): offsets give the right UTC instants (digits
    past the microsecond dropped); an optional object left out may lack its required
    properties, one that is there may not; a wrong JSON type, a fraction where the
    schema says integer, a null item, a malformed date or date-time are refused naming
    their JSON pointer."""
    schema, wrong = UNIT_SCHEMA, dict(WRONG)
    if route == "record":
        map_type = {"type": "object", "additionalProperties": {"type": "string"}}
        schema = {**schema, "properties": {**schema["properties"], "m": map_type}}
        wrong["/m/k: an integer where the schema says string"] = {"at": AT[1], "m": {"k": 1}}
    topic = unique_name("js-unit")
    context = SerializationContext(topic, MessageField.VALUE)
    lax = serializer(schema_registry, schema, validate=False)
    values = [lax({"at": t}, context) for t in AT]
    full = {"at": AT[1], "box": {"w": 2, "on": "2026-02-28"}, "xs": [1, 2]}
    values.append(lax({**full, "m": {"a": "b"}} if route == "record" else full, context))
    values += [lax(value, context) for value in wrong.values()]
    first = values[0]
    assert first is not None
    settings = RegistrySettings((schema_registry.url,))
    client = RegistryClient(settings)
    columns = format_of("json_schema").columns(
        client.schema(int.from_bytes(first[1:5])), client, None
    )
    table_schema = pa.schema([f.with_nullable(True) for f in columns])
    spec = FramedSpec("json_schema", settings, table_schema)
    fields, good, errors = decode_framed(pa.array(values, pa.binary()), spec)
    assert good.tolist() == list(range(len(AT) + 1))
    assert fields.column("at").to_pylist() == [*INSTANTS, INSTANTS[1]]
    assert fields.column("box").to_pylist()[-2:] == [None, {"w": 2, "on": dt.date(2026, 2, 28)}]
    if route == "record":
        assert fields.column("m").to_pylist()[-1] == [("a", "b")]
    assert [i for i, _ in errors] == list(range(len(AT) + 1, len(values)))
    for (_, reason), expected in zip(errors, wrong, strict=True):
        assert "does not fit schema id" in reason and f": {expected}" in reason, (expected, reason)
