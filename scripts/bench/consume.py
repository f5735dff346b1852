"""Consume benchmark: partition workers into shm Arrow segments vs confluent-kafka.

On one Tansu broker and the same topic (100-byte uncompressed values, 8-byte
keys, one partition), in the same run:

* worker: one worker process drains the partition into shm segments; the
  parent memory-maps every sealed segment as it arrives (records are then
  Arrow columns in the consumer's process) and releases it. Timed from the
  worker's WorkerStarted to the last segment read (process start-up and start
  position lookup are shown apart);
* confluent + Arrow: confluent-kafka's consumer in this process, building the
  same Arrow columns (``RECORD_SCHEMA``) from its messages;
* librdkafka raw: the same consumer counting messages, building nothing;
* N workers on an N-partition topic (same per-partition records), aggregate.

confluent-kafka runs with ``fetch.queue.backoff.ms=10`` (its default throttles
a fast consumer to a fifth; docs/kafka-compat.md). Each measurement is
the best of ``--repeat`` runs, alternating methods.

    .venv/bin/python scripts/bench/consume.py                  # 1M records, ~1 min
    .venv/bin/python scripts/bench/consume.py --records 300000 --partitions 2

The last line is ``RESULT worker_vs_confluent=<x> worker_vs_librdkafka_raw=<y>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _peers import confluent_to_arrow

from ingest.client import ClientConfig
from ingest.handoff import HandoffConfig, HandoffStore
from ingest.protocol.recordbatch.records import RECORD_SCHEMA
from ingest.testing import ProducedRecord, TansuBroker, create_topic, produce, unique_name
from ingest.worker import (
    EndPosition,
    SegmentSealed,
    StartPosition,
    WorkerFailed,
    WorkerFinished,
    WorkerHandle,
    WorkerSettings,
    WorkerStarted,
)

VALUE_BYTES = 100


def make_topic(bootstrap: str, partitions: int, per_partition: int) -> str:
    topic = unique_name(f"bench-consume-{partitions}p")
    create_topic(bootstrap, topic, partitions=partitions)
    value = b"v" * VALUE_BYTES

    def records() -> Any:
        for partition in range(partitions):
            for i in range(per_partition):
                yield ProducedRecord(value, key=b"%08d" % i, partition=partition)

    produce(bootstrap, topic, records(), enable_idempotence=False)
    return topic


# -- workers ----------------------------------------------------------------------------


def workers_rate(
    bootstrap: str, topic: str, partitions: int, per_partition: int
) -> tuple[float, float]:
    """Records/s from the last WorkerStarted to the last segment mapped; and start-up s."""
    config = HandoffConfig(segment_max_bytes=32 * 1024 * 1024)
    with HandoffStore(config) as store:
        spawned = time.perf_counter()
        handles = [
            WorkerHandle.spawn(
                WorkerSettings(
                    client=ClientConfig(bootstrap_servers=bootstrap),
                    topic=topic,
                    partition=partition,
                    handoff=store.location,
                    start=StartPosition.earliest(),
                    end=EndPosition.latest(),
                    log_level="WARNING",
                ),
                store=store,
            )
            for partition in range(partitions)
        ]
        started: list[float] = []
        rows = 0
        finished = 0
        tables: list[pa.Table] = []
        try:
            while finished < len(handles):
                for handle in handles:
                    for event in handle.receive(0.002):
                        if isinstance(event, WorkerStarted):
                            started.append(time.perf_counter())
                        elif isinstance(event, SegmentSealed):
                            table = store.read(event.uri)  # memory-mapped: no copy
                            rows += table.num_rows
                            tables.append(table)
                            handle.release([event.segment_id])
                        elif isinstance(event, WorkerFinished):
                            finished += 1
                        elif isinstance(event, WorkerFailed):
                            raise RuntimeError(event.traceback)
            done = time.perf_counter()
        finally:
            for handle in handles:
                handle.close()
    assert rows == partitions * per_partition, rows
    assert tables[0].schema == RECORD_SCHEMA
    return rows / (done - max(started)), max(started) - spawned


# -- confluent-kafka ----------------------------------------------------------------------


def _consumer(bootstrap: str, topic: str, partitions: int) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("bench"),
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return consumer


def confluent_arrow_rate(bootstrap: str, topic: str, count: int) -> float:
    """confluent-kafka messages -> the same Arrow columns, in this process."""
    consumer = _consumer(bootstrap, topic, 1)
    try:
        start = time.perf_counter()
        batch = confluent_to_arrow(consumer, topic, count)
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    assert batch.num_rows == count
    return count / elapsed


def librdkafka_raw_rate(bootstrap: str, topic: str, count: int) -> float:
    """confluent-kafka messages counted, nothing built: librdkafka's own pace."""
    consumer = _consumer(bootstrap, topic, 1)
    try:
        start = time.perf_counter()
        seen = 0
        while seen < count:
            messages = consumer.consume(10_000, 1.0)
            for msg in messages:
                if msg.error():
                    raise RuntimeError(msg.error())
            seen += len(messages)
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records a partition")
    parser.add_argument("--partitions", type=int, default=2, help="N for the N-worker run")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    print(f"# {os.cpu_count()} cores; {args.records} records of {VALUE_BYTES} B a partition")
    with TansuBroker() as broker:
        bootstrap = broker.bootstrap
        began = time.perf_counter()
        topic = make_topic(bootstrap, 1, args.records)
        print(f"# produced 1 partition in {time.perf_counter() - began:.1f}s")
        best: dict[str, float] = {}
        startup = 0.0
        for round_ in range(args.repeat):
            worker, startup = workers_rate(bootstrap, topic, 1, args.records)
            arrow = confluent_arrow_rate(bootstrap, topic, args.records)
            raw = librdkafka_raw_rate(bootstrap, topic, args.records)
            for name, rate in (("worker", worker), ("arrow", arrow), ("raw", raw)):
                best[name] = max(best.get(name, 0.0), rate)
            print(
                f"# round {round_ + 1}: worker {worker:,.0f}/s, confluent+Arrow {arrow:,.0f}/s, "
                f"librdkafka raw {raw:,.0f}/s"
            )
        many = 0.0
        if args.partitions > 1:
            wide = make_topic(bootstrap, args.partitions, args.records)
            for _ in range(args.repeat):
                many = max(many, workers_rate(bootstrap, wide, args.partitions, args.records)[0])

    print()
    print(f"{'path (same broker, same records)':44} {'records/s':>12} {'vs confluent+Arrow':>19}")
    rows = [
        ("1 worker -> shm Arrow segments (mapped)", best["worker"]),
        ("confluent-kafka -> Arrow, one process", best["arrow"]),
        ("librdkafka raw (confluent-kafka, no Arrow)", best["raw"]),
    ]
    if many:
        rows.append((f"{args.partitions} workers, {args.partitions} partitions", many))
    for label, rate in rows:
        print(f"{label:44} {rate:12,.0f} {rate / best['arrow']:18.2f}x")
    print(f"worker process start + start lookup: {startup:.2f}s (not in the rates)")
    print(
        f"RESULT worker_vs_confluent={best['worker'] / best['arrow']:.2f} "
        f"worker_vs_librdkafka_raw={best['worker'] / best['raw']:.2f}"
    )


if __name__ == "__main__":
    main()
