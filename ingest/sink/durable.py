"""What a table holds of each partition: the last offset durable in it (its txn version),
read from the table's log, and where a worker starts from it (invariant 3)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ingest.protocol.partition import Partition
from ingest.sink.delta import DeltaTarget
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import Router, TableConfig
from ingest.sink.txn import app_id

__all__ = ["lowest_durable", "start_offset", "txn_versions"]


def txn_versions(
    table: TableConfig | Router, partitions: Iterable[Partition]
) -> dict[Partition, int | None]:
    """Per partition, the last offset durable in its table (None: none yet); with a
    ``{topic}`` uri, each topic's own table; with routes by header or field, the lowest
    over the tables its records land in (None when one of them holds none)."""
    by_table: dict[str, tuple[TableConfig, list[Partition]]] = {}
    for partition in sorted(set(partitions)):
        targets = (
            table.tables_for(partition.topic)
            if isinstance(table, Router)
            else (table.for_topic(partition.topic),)
        )
        for target in targets:
            by_table.setdefault(target.uri, (target, []))[1].append(partition)
    per_table: list[dict[Partition, int | None]] = []
    for target, mine in by_table.values():
        apps = {p: app_id(target.uri, target.group, p.topic, p.partition) for p in mine}
        location = TableLocation.of(target.uri, target.storage_options)
        versions = DeltaTarget(location).versions(list(apps.values()))
        per_table.append({p: versions[apps[p]] for p in mine})
    return lowest_durable(per_table)


def lowest_durable(
    per_table: Iterable[Mapping[Partition, int | None]],
) -> dict[Partition, int | None]:
    """Per partition, the lowest durable offset over the tables it lands in (None when
    one of them holds none): a partition routed by header or field is in several."""
    found: dict[Partition, list[int | None]] = {}
    for landed in per_table:
        for partition, offset in landed.items():
            found.setdefault(partition, []).append(offset)
    return {
        p: None if None in values else min(v for v in values if v is not None)
        for p, values in found.items()
    }


def start_offset(committed: int | None, durable: int | None) -> int | None:
    """Invariant 3: max(group committed offset, Delta txn version + 1); None if neither."""
    candidates = [o for o in (committed, None if durable is None else durable + 1) if o is not None]
    return max(candidates) if candidates else None
