"""The upsert workload of the end-to-end benchmark: change events over a key space.

Event ``i`` (0 <= i < total) updates key ``i % keys`` and carries ``i`` in ``ts``; a key
always goes to partition ``key % partitions``, so the latest change of a key is the one with
the highest offset in its partition, and the expected table holds, for each key, the event
``k + keys * ((total - 1 - k) // keys)``. Values are the 100-byte JSON of ``_pipeline``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from _pipeline import await_leaders, json_value


def produce_changes(bootstrap: str, topic: str, partitions: int, total: int, keys: int) -> float:
    """Produces the ``total`` change events; returns the seconds it took."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1,  # order kept through retries
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    await_leaders(producer, topic, partitions)
    began = time.perf_counter()
    for i in range(total):
        key = i % keys
        while True:
            try:
                producer.produce(
                    topic,
                    json_value(key, i),
                    b"%d" % key,
                    key % partitions,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"produce: {left} undelivered, errors: {errors[:3]}")
    return time.perf_counter() - began


def check_latest(uri: str | Path, total: int, keys: int) -> str | None:
    """None when the table holds one row per key, the key's last change; else why not."""
    from deltalake import DeltaTable

    try:
        table = DeltaTable(str(uri)).to_pyarrow_table(columns=["id", "ts"])
    except Exception as exc:
        return f"unreadable: {exc}"
    expected_rows = min(keys, total)
    if table.num_rows != expected_rows:
        return f"{table.num_rows} rows, expected {expected_rows} (one per key)"
    ids = table.column("id").to_numpy()
    seqs = table.column("ts").to_numpy()
    order = np.argsort(ids)
    ids, seqs = ids[order], seqs[order]
    if not np.array_equal(ids, np.arange(expected_rows)):
        return "the keys are not 0..keys-1 once each"
    latest = ids + keys * ((total - 1 - ids) // keys)
    wrong = int((seqs != latest).sum())
    return f"{wrong} keys do not hold their last change" if wrong else None
