"""Avro decode benchmark: Confluent-framed values in memory -> Arrow columns.

1M values (``--records``) of a 10-field record with a nested record, a decimal, a
timestamp, an array, an enum and a nullable string (~200 bytes each), serialized by
confluent-kafka's ``AvroSerializer`` through a real schema registry (Apicurio, started
by the harness), then decoded by:

* ingest's ``ingest.formats.framed.decode_framed`` (format "avro": polars' reader over an in-memory object
  container, sizes checked back), in windows of 65,536 values as the decoder runs them;
* fastavro a record at a time (``schemaless_reader``) into ``pa.Table.from_pylist`` with
  the same columns: what a Python consumer does without a vectorized route;
* Spark's ``from_avro`` (``spark-avro_2.13`` at the installed pyspark's version, resolved
  by ``ingest.jars`` into the shared cache) in one ``local[2]`` session, as a Structured
  Streaming job decodes a Kafka ``value`` column: the 5-byte Confluent header cut with
  ``substring(value, 6)``, the writer's schema JSON given, the struct's fields as columns,
  evaluated in full by a ``noop`` write. The values are already in Spark (a cached
  DataFrame of one partition per 65,536 values, counted once before timing).

The registry's answer is cached before timing (ingest and fastavro fetch the schema once;
``from_avro`` is handed it). Ingest and fastavro decode in this one Python process; Spark
runs its tasks on both cores. Each line also gives the CPU seconds of the fastest run: this
process's threads, plus the Spark JVM's (from ``/proc``) for ``from_avro``.

    .venv/bin/python scripts/bench/avro_decode.py [--records 1000000] [--repeat 3]

The last line is ``RESULT records_per_s=<ingest> vs_fastavro=<ratio> vs_from_avro=<ratio>``
(each ratio: the peer's seconds / ingest's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ingest.formats.framed import FramedSpec, decode_framed, format_of
from ingest.registry import RegisteredSchema, RegistrySettings, client_for
from ingest.testing import SchemaRegistry

WINDOW = 65_536
SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["view", "click", "buy"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {
            "name": "device",
            "type": {
                "type": "record",
                "name": "Device",
                "fields": [{"name": "os", "type": "string"}, {"name": "build", "type": "int"}],
            },
        },
    ],
}  # fmt: skip


def event(n: int) -> dict[str, Any]:
    return {
        "id": n,
        "user": f"user-{n % 10_000:05d}",
        "amount": decimal.Decimal(n % 100_000) / 100,
        "at": dt.datetime(2026, 11, 24, tzinfo=dt.UTC) + dt.timedelta(microseconds=n * 997),
        "kind": ("view", "click", "buy")[n % 3],
        "tags": [f"tag-{n % 17}", f"campaign-{n % 101}", "mobile"][: 1 + n % 3],
        "note": None if n % 10 == 0 else f"event {n:08d}: " + "a note with some words in it, " * 4,
        "score": n / 7,
        "ok": n % 2 == 0,
        "device": {"os": ("android", "ios", "web")[n % 3], "build": 1000 + n % 500},
    }


def serialized(url: str, count: int) -> list[bytes]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(SCHEMA))
    context = SerializationContext("bench-avro", MessageField.VALUE)
    return [serializer(event(n), context) for n in range(count)]


def ingest_decode(values: pa.Array, spec: FramedSpec) -> int:
    rows = 0
    for start in range(0, len(values), WINDOW):
        fields, _good, errors = decode_framed(values.slice(start, WINDOW), spec)
        assert not errors, errors[:3]
        rows += fields.num_rows
    return rows


def fastavro_decode(values: list[bytes], schema: pa.Schema) -> int:
    import fastavro

    parsed = fastavro.parse_schema(SCHEMA)
    rows = 0
    for start in range(0, len(values), WINDOW):
        records = [
            fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None)
            for v in values[start : start + WINDOW]
        ]
        rows += pa.Table.from_pylist(records, schema=schema).num_rows
    return rows


def spark_session() -> Any:
    """One local[2] session with spark-avro on its class path (no Delta: nothing is
    written), the jar from the shared cache."""
    import pyspark
    from pyspark.sql import SparkSession

    from ingest.spark_env import beside_spark

    jars = beside_spark([f"org.apache.spark:spark-avro_2.13:{pyspark.__version__}"])
    classpath = ":".join(str(jar) for jar in jars)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-from-avro")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.extraClassPath", classpath)
        .config("spark.executor.extraClassPath", classpath)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def from_avro_seconds(array: pa.Array, repeat: int) -> tuple[float, float]:
    """Best of ``repeat`` runs of Spark's from_avro over the values, cached in Spark: wall
    and CPU seconds (the JVM's and this process's)."""
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import expr

    spark = spark_session()
    try:
        values = (
            spark.createDataFrame(pa.table({"value": array}))
            .repartition(max(2, -(-len(array) // WINDOW)))
            .cache()
        )
        assert values.count() == len(array)
        decoded = values.select(
            from_avro(expr("substring(value, 6)"), json.dumps(SCHEMA)).alias("v")
        ).select("v.*")
        assert decoded.columns == [field["name"] for field in SCHEMA["fields"]]
        jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        seconds, cpu, _ = best(
            repeat,
            lambda: decoded.write.format("noop").mode("overwrite").save(),
            lambda: process_cpu(jvm) + time.process_time(),
        )
        sample = decoded.limit(1).collect()[0].asDict(recursive=True)
        assert sample["amount"] is not None and sample["device"]["build"] >= 1000, sample
        values.unpersist()
        return seconds, cpu
    finally:
        spark.stop()


def best(repeat: int, run: Any, cpu: Any = time.process_time) -> tuple[float, float, Any]:
    """The fastest of ``repeat`` runs: its wall seconds, the CPU seconds ``cpu()`` counted
    over it (every thread of the process), and what it returned."""
    runs = []
    for _ in range(repeat):
        began, used = time.perf_counter(), cpu()
        out = run()
        runs.append((time.perf_counter() - began, cpu() - used, out))
    return min(runs, key=lambda entry: entry[0])


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of another process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
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
        writer = RegisteredSchema(schema_id=-1, schema_type="AVRO", text=json.dumps(SCHEMA))
        struct = format_of("avro").columns(writer, client_for(settings), None)
        assert isinstance(struct, pa.StructType)
        columns = pa.schema([struct.field(i).with_nullable(True) for i in range(struct.num_fields)])
        spec = FramedSpec("avro", settings, columns)
        decode_framed(array.slice(0, 10), spec)  # the schema, fetched and cached
        ours, ours_cpu, rows = best(args.repeat, lambda: ingest_decode(array, spec))
        assert rows == args.records
        theirs, theirs_cpu, rows = best(args.repeat, lambda: fastavro_decode(values, spec.schema))
        assert rows == args.records
    sparks, sparks_cpu = from_avro_seconds(array, args.repeat)
    for name, seconds, cpu in (
        ("ingest decode_framed", ours, ours_cpu),
        ("fastavro + from_pylist", theirs, theirs_cpu),
        ("Spark from_avro", sparks, sparks_cpu),
    ):
        print(
            f"{name:22}  {seconds:7.2f}s  {args.records / seconds:12,.0f} records/s  "
            f"CPU {cpu:6.2f}s"
        )
    print(
        f"RESULT records_per_s={args.records / ours:.0f} vs_fastavro={theirs / ours:.2f} "
        f"vs_from_avro={sparks / ours:.2f}"
    )


if __name__ == "__main__":
    main()
