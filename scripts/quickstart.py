"""Quickstart: an embedded broker, sample JSON events, and the pipeline so far.

Today the pipeline ends at the broker: the sample topic is produced and read
back. The Spark job into Delta joins here once the supervisor lands
(`ingest run --until-end`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from ingest.testing import Broker, ProducedRecord, create_topic, produce, read_topic


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--topic", default="quickstart-events")
    args = parser.parse_args()

    with Broker() as broker:
        print(f"broker: Tansu at {broker.bootstrap} (log {broker.log_path})")
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
        records = read_topic(broker.bootstrap, args.topic)
        per_partition = Counter(r.partition for r in records)
        print(
            f"read back {len(records)} records: "
            + ", ".join(f"p{p}={n}" for p, n in sorted(per_partition.items()))
        )
        print("first record:", records[0].value.decode() if records and records[0].value else None)
        if len(records) != sent:
            raise SystemExit(f"quickstart: expected {sent} records, read {len(records)}")
    print(
        "quickstart: the Delta pipeline (ingest run --until-end) is not built yet; stopping here."
    )


if __name__ == "__main__":
    main()
