"""The exactness check of an upsert table, deletes included: ``verify_upsert``.

``verify_exact`` wants every offset of the topic in the table or the dead-letter table; an
upsert table keeps one row per key, the one of the key's latest change, and none for a key
whose latest change deletes it. So this check replays the topic itself, read through
librdkafka, by the rule the test states (``change_of``: which key a record changes and
whether it deletes it, or None when it changes nothing), and compares the outcome with the
table read through delta-rs:

* each key whose latest change (by offset; a key must stay in one partition) upserts has
  exactly one row, and that row is the record of that change (topic, partition, offset);
* a key whose latest change deletes has no row, and no row holds a key the topic never
  changed;
* records in the dead-letter table are not changes; with ``dead`` the dead-letter table
  must hold exactly the records it names, once each;
* the group's committed offsets are at the end of every partition (a run that reached it;
  ``group=None`` skips this, for tables landed without a consumer group).

Like ``verify_exact``, nothing here comes from ingest's own code paths.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ingest.testing.kafka import ConsumedRecord, read_topic
from ingest.testing.verify import Verdict, _committed, _read_delta

__all__ = ["Change", "verify_upsert"]

_SHOWN = 10
Where = tuple[str, int, int]  # topic, partition, offset


@dataclass(frozen=True)
class Change:
    """What one record does to an upsert table: the key it changes (the merge key
    columns' values, in order) and whether it deletes the key's row."""

    key: tuple[Hashable, ...]
    delete: bool = False


def _listed(items: Sequence[Any]) -> str:
    shown = ", ".join(repr(i) for i in list(items)[:_SHOWN])
    return shown + (f", ... ({len(items)} in all)" if len(items) > _SHOWN else "")


def verify_upsert(
    bootstrap: str,
    topics: str | Sequence[str],
    group: str | None,
    table_uri: str,
    *,
    key_columns: Sequence[str],
    change_of: Callable[[ConsumedRecord], Change | None],
    dead_letter_uri: str | None = None,
    dead: Callable[[ConsumedRecord], bool] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Verdict:
    """Checks an upsert table against the topic and the group's commits (module doc)."""
    from confluent_kafka.admin import AdminClient

    names = [topics] if isinstance(topics, str) else list(topics)
    problems: list[str] = []
    records: list[ConsumedRecord] = []
    partitions: list[tuple[str, int]] = []
    for topic in names:
        records += read_topic(bootstrap, topic)
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
        partitions += [(topic, p) for p in sorted(meta.topics[topic].partitions)]
    by_place = {(r.topic, r.partition, r.offset): r for r in records}

    dead_table = _read_delta(dead_letter_uri, storage_options) if dead_letter_uri else None
    dead_places: list[Where] = []
    if dead_table is not None:
        dead_places = list(
            zip(
                dead_table.column("topic").to_pylist(),
                dead_table.column("partition").to_pylist(),
                dead_table.column("offset").to_pylist(),
                strict=True,
            )
        )
    dead_set = set(dead_places)
    if len(dead_set) != len(dead_places):
        problems.append(f"duplicate dead letters: {len(dead_places) - len(dead_set)}")
    strangers = sorted(dead_set - set(by_place))
    if strangers:
        problems.append(f"dead letters for records not in the topic: {_listed(strangers)}")
    if dead is not None:
        wanted = {place for place, r in by_place.items() if dead(r)}
        if wanted - dead_set:
            problems.append(f"records not dead-lettered: {_listed(sorted(wanted - dead_set))}")
        if dead_set - wanted - set(strangers):
            unexpected = sorted(dead_set - wanted - set(strangers))
            problems.append(f"records dead-lettered unexpectedly: {_listed(unexpected)}")

    latest: dict[tuple[Hashable, ...], tuple[ConsumedRecord, Change]] = {}
    for record in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        if (record.topic, record.partition, record.offset) in dead_set:
            continue
        change = change_of(record)
        if change is None:
            continue
        before = latest.get(change.key)
        if before is not None and (before[0].topic, before[0].partition) != (
            record.topic,
            record.partition,
        ):
            problems.append(
                f"key {change.key!r} is in {before[0].topic}/{before[0].partition} and "
                f"{record.topic}/{record.partition}: offsets do not order its changes"
            )
        latest[change.key] = (record, change)
    expected: dict[tuple[Hashable, ...], Where] = {
        key: (r.topic, r.partition, r.offset) for key, (r, c) in latest.items() if not c.delete
    }
    deleted = {key for key, (_, c) in latest.items() if c.delete}

    table = _read_table(table_uri, [*key_columns, "topic", "partition", "offset"], storage_options)
    rows: dict[tuple[Hashable, ...], Where] = {}
    twice: list[tuple[Hashable, ...]] = []
    for row in table:
        key = tuple(row[c] for c in key_columns)
        if key in rows:
            twice.append(key)
        rows[key] = (row["topic"], row["partition"], row["offset"])
    if twice:
        problems.append(f"keys with more than one row: {_listed(twice)}")
    missing = sorted(set(expected) - set(rows), key=repr)
    if missing:
        problems.append(f"keys without their row: {_listed(missing)}")
    kept = sorted(set(rows) & deleted, key=repr)
    if kept:
        problems.append(f"rows of keys whose latest change deletes them: {_listed(kept)}")
    unknown = sorted(set(rows) - set(expected) - deleted, key=repr)
    if unknown:
        problems.append(f"rows of keys no change upserts: {_listed(unknown)}")
    stale = sorted(
        (key for key in set(rows) & set(expected) if rows[key] != expected[key]), key=repr
    )
    if stale:
        shown = [(key, rows[key], expected[key]) for key in stale]
        problems.append(f"rows not from their key's latest change (row, latest): {_listed(shown)}")

    committed = _committed(bootstrap, group, partitions) if group is not None else {}
    ends: dict[tuple[str, int], int] = {}
    for key in partitions:
        offsets = [r.offset for r in records if (r.topic, r.partition) == key]
        ends[key] = max(offsets) + 1 if offsets else 0
        offset = committed.get(key)
        if group is not None and offsets and (offset is None or offset < ends[key]):
            problems.append(
                f"{key[0]}/{key[1]}: committed offset {offset} is short of the end {ends[key]}"
            )
    return Verdict(
        expected=len(records),
        rows=len(table),
        dead_letters=len(dead_places),
        committed=committed,
        ends=ends,
        problems=tuple(problems),
    )


def _read_table(
    uri: str, columns: Sequence[str], storage_options: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return []
    rows: list[dict[str, Any]] = table.to_pyarrow_table(columns=list(columns)).to_pylist()
    return rows
