"""Quickstart: an embedded broker, sample JSON events, and the whole pipeline into Delta.

1. starts the embedded Kafka broker (Tansu) on a free loopback port;
2. produces sample JSON events to a topic;
3. runs ``ingest run --until-end`` with ``conf/local.toml`` (its bootstrap server
   and table path pointed at this run): worker processes fetch the topic into
   Arrow segments, local Spark lands them in a Delta table, the consumer group's
   offsets are committed after the Delta commit;
4. prints ``ingest status`` and the table's row count and a few rows.

``--format avro`` also starts the embedded schema registry (Apicurio, Java 21+, from
``ingest.testing.registry``), produces the events as Confluent-framed Avro through
confluent-kafka's ``AvroSerializer`` (a decimal and a timestamp among the fields), and
runs with ``[table.value] format = "avro"`` and ``[schema_registry]`` pointed at it, as
``conf/avro.toml``: the table's columns come from the subject's latest schema. The
registry is stopped by PID at the end.

Everything it writes lives under ``var/quickstart/`` (wiped at the start).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingest.testing import ProducedRecord, TansuBroker, create_topic, produce

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "quickstart"


START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
# The JSON events' fields, with the amount as a decimal and the event's time as a timestamp.
AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "quickstart",
    "fields": [
        {"name": "event_id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["view", "click", "buy"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}  # fmt: skip


def json_value(i: int) -> bytes:
    return json.dumps(
        {
            "event_id": i,
            "user": f"user-{i % 97}",
            "amount": round(i * 0.37, 2),
            "kind": ("view", "click", "buy")[i % 3],
        }
    ).encode()


def sample_events(
    count: int, partitions: int, value: Callable[[int], bytes] = json_value
) -> list[ProducedRecord]:
    return [
        ProducedRecord(
            key=f"user-{i % 97}".encode(),
            value=value(i),
            partition=i % partitions,
            headers=[("source", b"quickstart")],
            timestamp_ms=START_MS + i * 10,
        )
        for i in range(count)
    ]


def avro_values(registry_url: str, topic: str) -> Callable[[int], bytes]:
    """Event ``i`` as confluent-kafka's AvroSerializer writes it: the schema registered under
    ``<topic>-value`` on first use, then a zero byte, its id and the Avro datum."""
    import datetime as dt
    import decimal

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(
        SchemaRegistryClient({"url": registry_url}), json.dumps(AVRO_SCHEMA)
    )
    context = SerializationContext(topic, MessageField.VALUE)
    start = dt.datetime.fromtimestamp(START_MS / 1000, dt.UTC)

    def value(i: int) -> bytes:
        event = {
            "event_id": i,
            "user": f"user-{i % 97}",
            "amount": decimal.Decimal(i * 37) / 100,
            "kind": ("view", "click", "buy")[i % 3],
            "at": start + dt.timedelta(milliseconds=i * 10),
        }
        return bytes(serializer(event, context))

    return value


def write_config(bootstrap: str, topic: str, registry_url: str | None = None) -> Path:
    """conf/local.toml, pointed at this broker, topic and a fresh table; with a registry,
    its values read as Avro (``[table.value] format = "avro"``, as conf/avro.toml)."""
    text = (ROOT / "conf" / "local.toml").read_text()
    text = re.sub(r"bootstrap_servers = \[.*\]", f'bootstrap_servers = ["{bootstrap}"]', text)
    text = re.sub(r"topics = \[.*\]", f'topics = ["{topic}"]', text)
    text = re.sub(r'uri = ".*"', f'uri = "{WORK / "tables" / "events"}"', text)
    if registry_url is not None:
        text = re.sub(
            r"\[table\.value\]\n(?:[^\[\n].*\n)*",
            "[table.value]\n"
            "# Confluent-framed Avro; the columns are the latest schema of <topic>-value.\n"
            'format = "avro"\n\n'
            "[schema_registry]\n"
            f'urls = ["{registry_url}"]\n'
            'on_error = "fail"\n',
            text,
        )
    path = WORK / "quickstart.toml"
    path.write_text(text)
    return path


def ingest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE
    )


def start_registry() -> Any:
    """The embedded schema registry, started and answering; SystemExit with the registry
    module's reason when it cannot run (no Java 21+ found, Apicurio not resolvable)."""
    from ingest.errors import DependencyError, HarnessError
    from ingest.testing.registry import APICURIO_VERSION, SchemaRegistry, registry_java

    try:
        java = registry_java()
        print(
            f"registry: starting Apicurio Registry {APICURIO_VERSION} on {java} "
            "(resolved from Maven Central into ~/.cache/ingest on first use)",
            flush=True,
        )
        registry = SchemaRegistry(java=java, work_dir=WORK / "registry")
        started = time.perf_counter()
        registry.start()
    except (DependencyError, HarnessError) as exc:
        raise SystemExit(f"quickstart: {exc}") from None
    print(
        f"registry: {registry.url} (pid {registry.pid}, log {registry.log_path}), "
        f"ready in {time.perf_counter() - started:.1f}s",
        flush=True,
    )
    return registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--topic", default="quickstart-events")
    parser.add_argument(
        "--format",
        choices=("json", "avro"),
        default="json",
        help="the values: JSON (default), or Confluent-framed Avro through an embedded "
        "schema registry (needs Java 21+)",
    )
    args = parser.parse_args()

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    registry = start_registry() if args.format == "avro" else None
    try:
        sent = land(args, registry)
    finally:
        if registry is not None and registry.running():
            registry.stop()
    if registry is not None:
        print(f"registry: stopped (pid {registry.pid})\n")

    from deltalake import DeltaTable

    table = DeltaTable(str(WORK / "tables" / "events"))
    rows = table.to_pyarrow_table().sort_by([("partition", "ascending"), ("offset", "ascending")])
    print(f"Delta table {table.table_uri}: version {table.version()}, {rows.num_rows} rows")
    columns = ["partition", "offset", "event_id", "user", "amount", "kind"]
    if registry is not None:
        columns.append("at")
        fields = (rows.schema.field(name) for name in columns[2:])
        print("   columns from the Avro schema:", ", ".join(f"{f.name} {f.type}" for f in fields))
    shown = rows.select(columns).slice(0, 5)
    for row in shown.to_pylist():
        print("  ", row)
    if rows.num_rows != sent:
        raise SystemExit(f"quickstart: expected {sent} rows, the table has {rows.num_rows}")


def land(args: argparse.Namespace, registry: Any) -> int:
    """Starts the broker, produces the events, runs ``ingest run --until-end`` and prints
    ``ingest status``; the number of events produced."""
    with TansuBroker() as broker:
        print(f"broker: Tansu at {broker.bootstrap} (log {broker.log_path})", flush=True)
        create_topic(broker.bootstrap, args.topic, partitions=args.partitions)
        started = time.perf_counter()
        value = json_value if registry is None else avro_values(registry.url, args.topic)
        sent = produce(
            broker.bootstrap,
            args.topic,
            sample_events(args.records, args.partitions, value),
            compression="zstd",
        )
        print(
            f"produced {sent} {args.format.upper()} events to {args.topic} in "
            f"{time.perf_counter() - started:.2f}s"
        )
        config = write_config(
            broker.bootstrap, args.topic, None if registry is None else registry.url
        )
        print(f"running: ingest run -c {config.relative_to(ROOT)} --until-end", flush=True)
        started = time.perf_counter()
        run = ingest("run", "-c", str(config), "--until-end")
        if run.returncode != 0:
            raise SystemExit(f"quickstart: ingest run failed with exit code {run.returncode}")
        print(f"ingest run --until-end finished in {time.perf_counter() - started:.1f}s\n")
        status = ingest("status", "-c", str(config))
        print(status.stdout)
    return sent


if __name__ == "__main__":
    main()
