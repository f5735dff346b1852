"""``ingest status``: where each partition stands, and the group as the broker sees it.

Per partition: the group's committed offset (OffsetFetch), the Delta txn
version (the last offset durable in the table), the end offset (the last
stable offset under read_committed, the high watermark otherwise; checked
against a Fetch where ListOffsets is not trusted), the lag (end minus where a
restart would begin: max(committed, txn version + 1)), the high watermark, so
that offsets held back by an open transaction show, the newest record's
timestamp (ListOffsets MAX_TIMESTAMP, where offered), and when the table last took data of the
partition (its txn action's ``lastUpdated``, or the time of the commit that
holds it). Then the table's last commit. Then the
group: its state, protocol and members (DescribeGroups; Tansu answers with
empty member details), its coordinator, and the ``__consumer_offsets``
partition that holds it.

Nothing here needs the group membership, so it can run beside ``ingest run``.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Mapping, Sequence
from typing import Any

from rich.box import SIMPLE_HEAD, Box
from rich.console import Console
from rich.table import Table

from ingest.client import ClientConfig, Cluster
from ingest.client.admin import describe_group, source_topics, topic_partitions
from ingest.config import IngestConfig, offsets_topic_partition
from ingest.errors import IngestError
from ingest.membership.committed import as_offsets, committed_offsets
from ingest.protocol.partition import Partition
from ingest.sink.durable import start_offset, txn_versions
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id
from ingest.sink.txnlog import txn_times
from ingest.supervisor.output.metrics import Metrics
from ingest.supervisor.wiring import client_config, fetch_settings, table_router
from ingest.worker import FetchSettings
from ingest.worker.ends import EndMarks, end_marks, end_offsets

__all__ = ["collect_lag", "collect_status", "print_table", "render_text"]


def _last_commit(uri: str, options: dict[str, str]) -> dict[str, Any] | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=options or None)
    except TableNotFoundError:
        return None
    history = table.history(limit=1)
    if not history:
        return None
    entry = history[0]
    stamp = entry.get("timestamp")
    when = (
        dt.datetime.fromtimestamp(stamp / 1000, dt.UTC).isoformat(timespec="seconds")
        if isinstance(stamp, int | float)
        else None
    )
    return {"version": table.version(), "time": when, "operation": entry.get("operation")}


def _iso(stamp_ms: int | None) -> str | None:
    if stamp_ms is None:
        return None
    return dt.datetime.fromtimestamp(stamp_ms / 1000, dt.UTC).isoformat(timespec="seconds")


def _partition_times(
    uri: str, options: dict[str, str], group: str, partitions: list[Partition]
) -> dict[Partition, str | None]:
    apps = {p: app_id(uri, group, p.topic, p.partition) for p in partitions}
    times = txn_times(TableLocation.of(uri, options), list(apps.values()))
    return {p: _iso(times[apps[p]]) for p in partitions}


def collect_status(config: IngestConfig) -> dict[str, Any]:
    """The report as plain data (``--json`` prints it as it is)."""
    group = config.source.group_id
    table = table_router(config)
    with Cluster(client_config(config)) as cluster:
        source = config.source
        topics = source.topics or [f"/{source.topic_pattern}/"]
        try:
            topics = source_topics(cluster, source.topics, source.topic_pattern)
            partitions = topic_partitions(cluster, topics)
        except IngestError as exc:
            raise IngestError(
                f"cannot read the metadata of {', '.join(topics)} from "
                f"{', '.join(config.kafka.bootstrap_servers)}: {exc}"
            ) from exc
        committed = as_offsets(committed_offsets(cluster, group, partitions))
        settings = fetch_settings(config)
        marks = end_marks(cluster, partitions, settings)
        description = describe_group(cluster, group)
    durable = txn_versions(table, partitions)
    # Each topic's own table with a {topic} uri; else one table for all. With routes
    # by header or field, a topic's records land in several: the first is its table,
    # and each one's lag counts from its own txn version.
    tables = {p.topic: table.tables_for(p.topic) for p in partitions}
    lasts: dict[str, dict[str, Any] | None] = {}
    landed_at: dict[Partition, str | None] = {}
    table_lag: dict[str, int] = {}
    for target in {t.uri: t for ts in tables.values() for t in ts}.values():
        options = dict(target.storage_options)
        lasts[target.uri] = last = _last_commit(target.uri, options)
        mine = [p for p in partitions if target.uri in {t.uri for t in tables[p.topic]}]
        times = (
            _partition_times(target.uri, options, group, mine)
            if last is not None
            else dict.fromkeys(mine)
        )
        own = txn_versions(target, mine)
        table_lag[target.uri] = sum(
            _end(marks[p], settings.read_committed) - (start_offset(committed[p], own[p]) or 0)
            for p in mine
        )
        for p in mine:
            if tables[p.topic][0].uri == target.uri:
                landed_at[p] = times[p]
    rows = []
    for partition in partitions:
        resume = start_offset(committed[partition], durable[partition])
        mark = marks[partition]
        end = _end(mark, settings.read_committed)
        rows.append(
            {
                "table": tables[partition.topic][0].uri,
                "tables": [t.uri for t in tables[partition.topic]],
                "topic": partition.topic,
                "partition": partition.partition,
                "committed": committed[partition],
                "txn_version": durable[partition],
                "end": end,
                "lag": end - (resume or 0),
                "high_watermark": mark.high_watermark,
                "newest_record": _iso(mark.newest_timestamp),
                "last_commit": landed_at[partition],
            }
        )
    return {
        "group": {
            "id": group,
            "state": description.state,
            "protocol_type": description.protocol_type,
            "protocol": description.protocol,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "host": m.client_host,
                    "partitions": [str(p) for p in m.assignment],
                }
                for m in description.members
            ],
            "coordinator": description.coordinator,
            "offsets_topic_partition": offsets_topic_partition(
                group, config.source.offsets_topic_partitions
            ),
        },
        "table": {
            "uri": table.default.uri,
            "last_commit": lasts.get(table.default.uri),
        },
        "tables": [
            {
                "uri": uri,
                "last_commit": lasts[uri],
                "lag": table_lag[uri],
            }
            for uri in sorted(lasts)
        ],
        "partitions": rows,
        "total_lag": sum(r["lag"] for r in rows),
        "lag_against": "last_stable_offset" if settings.read_committed else "high_watermark",
        "held_back": {str(p): m.held_back for p, m in marks.items() if m.held_back},
    }


def _end(mark: EndMarks, read_committed: bool) -> int:
    return mark.last_stable_offset if read_committed else mark.high_watermark


_COLUMNS = (
    "topic",
    "partition",
    "committed",
    "txn_version",
    "end",
    "lag",
    "high_watermark",
    "newest_record",
    "last_commit",
)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _heading(report: dict[str, Any]) -> list[str]:
    group = report["group"]
    table = report["table"]
    last = table["last_commit"]
    lines = [
        f"group {group['id']}: state {group['state'] or '-'}, "
        f"protocol {group['protocol'] or '-'} ({group['protocol_type'] or '-'}), "
        f"{len(group['members'])} member(s)",
        f"coordinator {group['coordinator']}, "
        f"__consumer_offsets partition {group['offsets_topic_partition']}",
    ]
    for member in group["members"]:
        static = f" instance {member['group_instance_id']}" if member["group_instance_id"] else ""
        owned = ",".join(member["partitions"]) or "-"
        lines.append(f"  member {member['member_id']}{static} ({member['host']}): {owned}")
    if last is None:
        lines.append(f"table {table['uri']}: not created yet")
    else:
        lines.append(
            f"table {table['uri']}: version {last['version']}, "
            f"last commit {last['time'] or '-'} ({last['operation'] or '-'})"
        )
    return lines


def _footer(report: dict[str, Any]) -> list[str]:
    held = report["held_back"]
    if report["lag_against"] == "last_stable_offset":
        note = "end and lag are against the last stable offset (isolation read_committed)"
        if held:
            parts = ", ".join(f"{p} {n}" for p, n in held.items())
            note += f"; open transactions hold back offsets: {parts}"
    else:
        note = "end and lag are against the high watermark (isolation read_uncommitted)"
    return [f"total lag {report['total_lag']}", note]


def render_text(report: dict[str, Any]) -> str:
    """The report as plain text (off a terminal): the same table, without its rule."""
    out = io.StringIO()
    plain = Console(file=out, width=10_000, color_system=None, markup=False, highlight=False)
    print_table(report, plain, box=None)
    return out.getvalue()


def print_table(report: dict[str, Any], console: Console, *, box: Box | None = SIMPLE_HEAD) -> None:
    """The report on a terminal: the partitions as a ``rich`` table."""
    for line in _heading(report):
        console.print(line)
    table = Table(box=box, pad_edge=box is not None)
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "topic" else "right")
    for row in report["partitions"]:
        table.add_row(*(_cell(row[key]) for key in _COLUMNS))
    console.print(table)
    for line in _footer(report):
        console.print(line)


def collect_lag(
    metrics: Metrics, rows: Sequence[Mapping[str, Any]], client: ClientConfig, fetch: FetchSettings
) -> None:
    """End offsets and lag of the partitions in ``rows`` (a running engine's status), read
    on a ``Cluster`` of its own: called at scrape time, on the metrics thread."""
    if not rows:
        return
    partitions = [Partition(r["topic"], r["partition"]) for r in rows]
    with Cluster(client) as cluster:
        ends = end_offsets(cluster, partitions, fetch)
    for row in rows:
        partition = Partition(row["topic"], row["partition"])
        labels = {"topic": partition.topic, "partition": partition.partition}
        end = ends[partition]
        metrics.set("ingest_partition_end_offset", end, **labels)
        position = row["committed"] if row["committed"] is not None else 0
        metrics.set("ingest_partition_lag", max(end - position, 0), **labels)
