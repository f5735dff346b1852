"""JSON Schema decode benchmark: Confluent-framed JSON values in memory -> Arrow columns.

1M values (``--records``) of a 9-property object with a nested object, a date-time, an
enum, an array and a nullable string (~230 bytes each), serialized by confluent-kafka's
``JSONSerializer`` through a real schema registry (Apicurio, started by the harness;
its validation off, which writes the same bytes for these valid values ten times faster),
then decoded by:

* ingest's frame with the ``json_schema`` format (``ingest.formats.framed.decode_framed``:
  the header stripped with Arrow compute, the JSON parsed by Arrow's reader, required
  properties and the date-time's form checked, the date-time converted), in windows of
  65,536 values as the decoder runs them;
* ``json.loads`` a record at a time into ``pa.Table.from_pylist`` with the same columns
  (the date-time cast from its string afterwards), checking nothing: what a Python
  consumer does without a vectorized route; and the same with ``orjson.loads``.

The registry's answer is cached before timing (both sides fetch the schema once).

    .venv/bin/python scripts/bench/json_schema_decode.py [--records 1000000] [--repeat 3]

The last line is ``RESULT records_per_s=<ingest> vs_json_loads=<ratio>``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ingest.formats.framed import FramedSpec, decode_framed, format_of
from ingest.registry import RegistrySettings, client_for
from ingest.testing import SchemaRegistry

WINDOW = 65_536
SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Event",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "amount": {"type": "number"},
        "at": {"type": "string", "format": "date-time"},
        "kind": {"type": "string", "enum": ["view", "click", "buy"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["null", "string"]},
        "ok": {"type": "boolean"},
        "device": {
            "type": "object",
            "properties": {"os": {"type": "string"}, "build": {"type": "integer"}},
            "required": ["os"],
        },
    },
    "required": ["id", "user", "at", "device"],
}


def event(n: int) -> dict[str, Any]:
    at = dt.datetime(2026, 11, 24, tzinfo=dt.UTC) + dt.timedelta(microseconds=n * 997)
    return {
        "id": n,
        "user": f"user-{n % 10_000:05d}",
        "amount": (n % 100_000) / 100,
        "at": at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "kind": ("view", "click", "buy")[n % 3],
        "tags": [f"tag-{n % 17}", f"campaign-{n % 101}", "mobile"][: 1 + n % 3],
        "note": None if n % 10 == 0 else f"event {n:08d}: " + "a note with some words, " * 3,
        "ok": n % 2 == 0,
        "device": {"os": ("android", "ios", "web")[n % 3], "build": 1000 + n % 500},
    }


def serialized(url: str, count: int) -> list[bytes]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": url})
    serializer = JSONSerializer(json.dumps(SCHEMA), client, conf={"validate": False})
    context = SerializationContext("bench-json-schema", MessageField.VALUE)
    out = []
    for n in range(count):
        value = serializer(event(n), context)
        assert value is not None
        out.append(value)
    return out


def ingest_decode(values: pa.Array, spec: FramedSpec) -> int:
    rows = 0
    for start in range(0, len(values), WINDOW):
        fields, _good, errors = decode_framed(values.slice(start, WINDOW), spec)
        assert not errors, errors[:3]
        rows += fields.num_rows
    return rows


def python_decode(values: list[bytes], schema: pa.Schema, loads: Callable[[bytes], Any]) -> int:
    strings = pa.schema([f.with_type(pa.string()) if f.name == "at" else f for f in schema])
    rows = 0
    for start in range(0, len(values), WINDOW):
        records = [loads(v[5:]) for v in values[start : start + WINDOW]]
        table = pa.Table.from_pylist(records, schema=strings)
        at = pc.cast(table.column("at"), schema.field("at").type)
        rows += table.set_column(table.schema.get_field_index("at"), "at", at).num_rows
    return rows


def best(repeat: int, run: Callable[[], int]) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - began)
    return min(times), rows


def main() -> None:
    import orjson

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with SchemaRegistry() as registry:
        began = time.perf_counter()
        values = serialized(registry.url, args.records)
        mean = sum(len(v) for v in values) / len(values)
        print(
            f"# {args.records:,} values, {mean:.0f} bytes each on average, serialized in "
            f"{time.perf_counter() - began:.1f}s",
            flush=True,
        )
        array = pa.array(values, pa.binary())
        settings = RegistrySettings((registry.url,))
        client = client_for(settings)
        writer = client.schema(int.from_bytes(values[0][1:5]))
        columns = format_of("json_schema").columns(writer, client, None)
        schema = pa.schema([f.with_nullable(True) for f in columns])
        spec = FramedSpec("json_schema", settings, schema)
        ours, rows = best(args.repeat, lambda: ingest_decode(array, spec))
        assert rows == args.records
        stdlib, rows = best(args.repeat, lambda: python_decode(values, schema, json.loads))
        assert rows == args.records
        fast, rows = best(args.repeat, lambda: python_decode(values, schema, orjson.loads))
        assert rows == args.records
    n = args.records
    print(f"ingest json_schema (Arrow)  {ours:7.2f}s  {n / ours:12,.0f} records/s")
    print(f"json.loads + from_pylist    {stdlib:7.2f}s  {n / stdlib:12,.0f} records/s")
    print(f"orjson.loads + from_pylist  {fast:7.2f}s  {n / fast:12,.0f} records/s")
    print(f"RESULT records_per_s={n / ours:.0f} vs_json_loads={stdlib / ours:.2f}")


if __name__ == "__main__":
    main()
