"""The Avro workload of e2e.py (``--avro``): Confluent-framed Avro values through a real
schema registry, ingest against Structured Streaming with ``from_avro``.

The values carry the JSON workload's fields (``id``, ``user``, ``amount``, ``kind``, ``ts``,
``pad``; the same content, so the tables are checked exact the same way) as an Avro
record registered under ``<topic>-value`` in the harness's registry (Apicurio, Confluent's
API). Each value is the 5-byte Confluent header (magic 0, the schema id) and the record
written by fastavro's ``schemaless_writer``.

* (a) ingest: ``[table.value] format = "avro"`` with the same columns, the writer's schema
  from ``[schema_registry]``, product defaults otherwise (the local engine);
* (d) Structured Streaming: the Kafka source, ``from_avro`` (``spark-avro`` for the
  installed Spark) over ``substring(value, 6)`` with the registry's schema JSON fetched
  once before the query (Spark's ``from_avro`` does not read Confluent framing itself),
  delta-spark's sink, ``Trigger.AvailableNow``, as the JSON peer (``_structured.py``).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _peer_process import committed_lag, run_peer_process, spark_source_groups
from _pipeline import check_exact, ingest_until_end, produce_json, warm_topic

from ingest.testing import create_topic, unique_name

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "kind", "type": "string"},
        {"name": "ts", "type": "long"},
        {"name": "pad", "type": "string"},
    ],
}
KINDS = ("view", "click", "purchase", "refund")


def register(url: str, subject: str) -> int:
    """Registers AVRO_SCHEMA under ``subject``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    return int(client.register_schema(subject, Schema(json.dumps(AVRO_SCHEMA), "AVRO")))


def encoder(schema_id: int, pad: int = 40) -> Callable[[int, int, int], bytes]:
    """``encode(id, ts_ms, _size)`` for ``produce_json``: the framed Avro value of a record
    with the JSON workload's fields (its ``pad`` ``pad`` bytes long)."""
    import fastavro

    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    header = struct.pack(">bI", 0, schema_id)
    padding = "x" * pad

    def encode(record_id: int, ts_ms: int, _size: int) -> bytes:
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(
            out,
            parsed,
            {
                "id": record_id,
                "user": f"user-{record_id % 50_000:05d}",
                "amount": (record_id % 10_000) + (record_id % 100) / 100,
                "kind": KINDS[record_id % 4],
                "ts": ts_ms,
                "pad": padding,
            },
        )
        return out.getvalue()

    return encode


def schema_json(url: str, subject: str) -> str:
    """The subject's latest schema, as Structured Streaming's job would fetch it."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return str(SchemaRegistryClient({"url": url}).get_latest_version(subject).schema.schema_str)


def run_avro(
    args: Any, bootstrap: str, registry_url: str, workdir: Path, records: int
) -> dict[str, dict[str, Any]]:
    """(a) and (d) over ``records`` Avro values in ``args.partitions`` partitions."""
    per = records // args.partitions
    ends = dict.fromkeys(range(args.partitions), per)
    label = f"{per * args.partitions:,} x Avro"
    topic = unique_name("bench-e2e-avro")
    subject = f"{topic}-value"
    create_topic(bootstrap, topic, partitions=args.partitions)
    encode = encoder(register(registry_url, subject))
    produced = produce_json(bootstrap, topic, args.partitions, per, idempotent=True, encode=encode)
    print(f"# {label}: produced in {produced:.1f}s", flush=True)
    warm_topic(bootstrap, topic, ends)
    here = workdir / "avro"
    here.mkdir()
    results: dict[str, dict[str, Any]] = {}
    for name in ("ours", "ss"):
        if name not in args.pipelines:
            continue
        if name == "ours":
            protocol = "consumer" if args.broker == "kafka" else "classic"
            sections = {
                "source": {"group_protocol": protocol},
                "table.value": {"format": "avro"},
                "schema_registry": {"urls": [registry_url]},
            }
            result = ingest_until_end(name, here, bootstrap, topic, ends, per, sections=sections)
            result["table"] = here / name
            result["phases"] = result["phases"].describe()
            result["lag"] = committed_lag(bootstrap, result["group"], topic, ends)
        else:
            schema_file = here / "schema.avsc"
            schema_file.write_text(schema_json(registry_url, subject))
            extra = ("--avro-schema", str(schema_file))
            result = run_peer_process("ss-avro", here, bootstrap, topic, ends, extra)
            result["problem"] = check_exact(result["table"], ends, per)
            found = spark_source_groups(bootstrap)
            result["lag"] = committed_lag(bootstrap, found[-1], topic, ends) if found else "no"
        result["label"] = label
        results[name] = result
        print(
            f"# {label} {name}: {result['seconds']:.1f}s exact: {result['problem'] or 'yes'}"
            f" {result.get('phases', '')}",
            flush=True,
        )
    return results
