"""The exactness check every fault-injection case ends with.

``verify_exact`` compares three independent views, each read from its own server:

* the topic, through librdkafka (``read_topic``): the offsets that hold data records;
* the Delta table (and the dead-letter table), through delta-rs: (topic, partition, offset)
  of every row;
* the group's committed offsets, through librdkafka's OffsetFetch (no join).

Exact means: every data offset of the topic is in the table or in the dead-letter table,
once, and in only one of them; neither holds an offset the topic does not have; and no
committed offset runs ahead of what the tables hold (every data offset below it is there).
``require_complete`` (the default; a run that reached the end) also wants every offset
landed and the commits at the end; without it (right after a crash) only the safety
properties are checked: no duplicate, nothing extra, nothing committed ahead.

This is the check of an append table. An upsert table keeps one row per key (superseded
and deleted offsets leave none): ``verify_upsert`` (``verify_upsert.py``) checks it.

Nothing here comes from ingest's own code paths (no ``Cluster``, no ``DeltaTarget``), so a
bug there cannot hide itself from the check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ingest.errors import HarnessError
from ingest.testing.kafka import read_topic

__all__ = ["Verdict", "verify_exact"]

PartitionKey = tuple[str, int]
_SHOWN = 10  # offsets listed per problem; the counts are always complete


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check. ``problems`` is empty when the table is exact."""

    expected: int  # data records in the topic
    rows: int  # rows in the table
    dead_letters: int
    committed: Mapping[PartitionKey, int | None]
    ends: Mapping[PartitionKey, int]  # next offset after the last data record seen
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exact(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        head = (
            f"topic {self.expected} records, table {self.rows} rows, "
            f"{self.dead_letters} dead letters"
        )
        if self.exact:
            return f"exact: {head}"
        return "NOT exact: " + head + "\n  " + "\n  ".join(self.problems)

    def raise_if_not_exact(self) -> None:
        if not self.exact:
            raise AssertionError(self.describe())


def _keys(table: pa.Table) -> dict[PartitionKey, np.ndarray]:
    """Sorted offsets per (topic, partition)."""
    out: dict[PartitionKey, np.ndarray] = {}
    if table.num_rows == 0:
        return out
    topics = table.column("topic").to_numpy(zero_copy_only=False)
    partitions = table.column("partition").to_numpy()
    offsets = table.column("offset").to_numpy()
    for topic in np.unique(topics):
        of_topic = topics == topic
        for partition in np.unique(partitions[of_topic]):
            mask = of_topic & (partitions == partition)
            out[(str(topic), int(partition))] = np.sort(offsets[mask])
    return out


def _read_delta(uri: str, storage_options: Mapping[str, str] | None) -> pa.Table | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return None
    return table.to_pyarrow_table(columns=["topic", "partition", "offset"])


def _committed(
    bootstrap: str, group: str, partitions: Sequence[PartitionKey]
) -> dict[PartitionKey, int | None]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        answer = consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=30)
    finally:
        consumer.close()
    out: dict[PartitionKey, int | None] = {}
    for tp in answer:
        if tp.error is not None:
            raise HarnessError(
                f"OffsetFetch of group {group!r} for {tp.topic}/{tp.partition}: {tp.error}"
            )
        out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
    return out


def _show(values: Iterable[int]) -> str:
    listed = [int(v) for v in values]
    text = ", ".join(map(str, listed[:_SHOWN]))
    return text + (f", ... ({len(listed)} in all)" if len(listed) > _SHOWN else "")


def _duplicates(offsets: np.ndarray) -> np.ndarray:
    return np.unique(offsets[1:][offsets[1:] == offsets[:-1]])


def verify_exact(
    bootstrap: str,
    topics: str | Sequence[str],
    group: str,
    table_uri: str,
    *,
    dead_letter_uri: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    require_complete: bool = True,
) -> Verdict:
    """Checks the table against the topic and the group's commits (see the module doc)."""
    from confluent_kafka.admin import AdminClient

    names = [topics] if isinstance(topics, str) else list(topics)
    expected: dict[PartitionKey, np.ndarray] = {}
    partitions: list[PartitionKey] = []
    for topic in names:
        consumed = read_topic(bootstrap, topic)
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
        partitions += [(topic, p) for p in sorted(meta.topics[topic].partitions)]
        by_partition: dict[int, list[int]] = {}
        for record in consumed:
            by_partition.setdefault(record.partition, []).append(record.offset)
        for partition, offsets in by_partition.items():
            expected[(topic, partition)] = np.sort(np.asarray(offsets, dtype=np.int64))

    rows_table = _read_delta(table_uri, storage_options)
    rows = _keys(rows_table) if rows_table is not None else {}
    dead_table = _read_delta(dead_letter_uri, storage_options) if dead_letter_uri else None
    dead = _keys(dead_table) if dead_table is not None else {}
    committed = _committed(bootstrap, group, partitions)

    problems: list[str] = []
    empty = np.empty(0, dtype=np.int64)
    for key in sorted((set(rows) | set(dead)) - set(partitions)):
        problems.append(f"{key[0]}/{key[1]}: the tables hold a partition the topic lacks")
    ends: dict[PartitionKey, int] = {}
    for key in partitions:
        want = expected.get(key, empty)
        have = rows.get(key, empty)
        bad = dead.get(key, empty)
        where = f"{key[0]}/{key[1]}"
        ends[key] = int(want[-1]) + 1 if len(want) else 0
        for name, column in (("table", have), ("dead-letter table", bad)):
            duplicated = _duplicates(column)
            if len(duplicated):
                problems.append(f"{where}: duplicate offsets in the {name}: {_show(duplicated)}")
        both = np.intersect1d(have, bad)
        if len(both):
            problems.append(f"{where}: offsets both in the table and dead-lettered: {_show(both)}")
        landed = np.union1d(have, bad)
        missing = np.setdiff1d(want, landed)
        if require_complete and len(missing):
            problems.append(f"{where}: missing offsets: {_show(missing)}")
        extra = np.setdiff1d(have, want)
        if len(extra):
            problems.append(f"{where}: table rows for offsets not in the topic: {_show(extra)}")
        unaccounted = np.setdiff1d(bad, want)
        if len(unaccounted):
            problems.append(
                f"{where}: dead letters for offsets not in the topic: {_show(unaccounted)}"
            )
        offset = committed.get(key)
        if offset is not None:
            below = want[want < offset]
            behind = np.setdiff1d(below, landed)
            if len(behind):
                problems.append(
                    f"{where}: committed offset {offset} runs ahead of the table, which lacks "
                    f"{_show(behind)}"
                )
        if require_complete and len(want) and (offset is None or offset < ends[key]):
            problems.append(f"{where}: committed offset {offset} is short of the end {ends[key]}")
    return Verdict(
        expected=sum(len(v) for v in expected.values()),
        rows=0 if rows_table is None else rows_table.num_rows,
        dead_letters=0 if dead_table is None else dead_table.num_rows,
        committed=committed,
        ends=ends,
        problems=tuple(problems),
    )
