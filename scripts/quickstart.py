"""Quickstart: an embedded broker, sample JSON events, and the whole pipeline into Delta.

1. starts the embedded Kafka broker (Tansu) on a free loopback port;
2. produces sample JSON events to a topic;
3. runs ``ingest run --until-end`` with ``conf/local.toml`` (its bootstrap server
   and table path pointed at this run): worker processes fetch the topic into
   Arrow segments, local Spark lands them in a Delta table, the consumer group's
   offsets are committed after the Delta commit;
4. prints ``ingest status`` and the table's row count and a few rows.

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
from pathlib import Path

from ingest.testing import ProducedRecord, TansuBroker, create_topic, produce

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "quickstart"


def sample_events(count: int, partitions: int) -> list[ProducedRecord]:
    start_ms = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    return [
        ProducedRecord(
            key=f"user-{i % 97}".encode(),
            value=json.dumps(
                {
                    "event_id": i,
                    "user": f"user-{i % 97}",
                    "amount": round(i * 0.37, 2),
                    "kind": ("view", "click", "buy")[i % 3],
                }
            ).encode(),
            partition=i % partitions,
            headers=[("source", b"quickstart")],
            timestamp_ms=start_ms + i * 10,
        )
        for i in range(count)
    ]


def write_config(bootstrap: str, topic: str) -> Path:
    """conf/local.toml, pointed at this broker, topic and a fresh table."""
    text = (ROOT / "conf" / "local.toml").read_text()
    text = re.sub(r"bootstrap_servers = \[.*\]", f'bootstrap_servers = ["{bootstrap}"]', text)
    text = re.sub(r"topics = \[.*\]", f'topics = ["{topic}"]', text)
    text = re.sub(r'uri = ".*"', f'uri = "{WORK / "tables" / "events"}"', text)
    path = WORK / "quickstart.toml"
    path.write_text(text)
    return path


def ingest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--topic", default="quickstart-events")
    args = parser.parse_args()

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with TansuBroker() as broker:
        print(f"broker: Tansu at {broker.bootstrap} (log {broker.log_path})", flush=True)
        create_topic(broker.bootstrap, args.topic, partitions=args.partitions)
        started = time.perf_counter()
        sent = produce(
            broker.bootstrap,
            args.topic,
            sample_events(args.records, args.partitions),
            compression="zstd",
        )
        print(
            f"produced {sent} JSON events to {args.topic} in {time.perf_counter() - started:.2f}s"
        )
        config = write_config(broker.bootstrap, args.topic)
        print(f"running: ingest run -c {config.relative_to(ROOT)} --until-end", flush=True)
        started = time.perf_counter()
        run = ingest("run", "-c", str(config), "--until-end")
        if run.returncode != 0:
            raise SystemExit(f"quickstart: ingest run failed with exit code {run.returncode}")
        print(f"ingest run --until-end finished in {time.perf_counter() - started:.1f}s\n")
        status = ingest("status", "-c", str(config))
        print(status.stdout)

    from deltalake import DeltaTable

    table = DeltaTable(str(WORK / "tables" / "events"))
    rows = table.to_pyarrow_table().sort_by([("partition", "ascending"), ("offset", "ascending")])
    print(f"Delta table {table.table_uri}: version {table.version()}, {rows.num_rows} rows")
    shown = rows.select(["partition", "offset", "event_id", "user", "amount", "kind"]).slice(0, 5)
    for row in shown.to_pylist():
        print("  ", row)
    if rows.num_rows != sent:
        raise SystemExit(f"quickstart: expected {sent} rows, the table has {rows.num_rows}")


if __name__ == "__main__":
    main()
