"""Where each partition stands: end offsets, committed offsets, Delta txn versions.

These are the supervisor's (and ``ingest status``'s) own reads, on a
``Cluster`` the caller owns; group membership is not needed for any of them.

* End offsets come from ``PartitionFetcher.latest_offset``: ListOffsets (last
  stable offset under read_committed), checked against a Fetch's high watermark
  on brokers whose ListOffsets "latest" is wrong (Tansu 0.6.0;
  docs/kafka-compat.md). ``end_marks`` gives both ends, and the newest record's
  timestamp where the broker answers MAX_TIMESTAMP.
* Committed offsets are an OffsetFetch to the group coordinator.
* Txn versions are read from the table's log: the last offset of each
  partition that is durable in the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ingest.client import Cluster
from ingest.client.connection import expect_response
from ingest.errors import BrokerError, IngestError
from ingest.group import CommittedOffset, Partition
from ingest.group.requests import fetch_outcome, offset_fetch_request
from ingest.protocol.consumer import decode_assignment
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import (
    MAX_TIMESTAMP,
    MAX_TIMESTAMP_MIN_VERSION,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListOffsetsRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from ingest.sink.config import Router, TableConfig
from ingest.sink.delta import DeltaTarget
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id
from ingest.worker import FetchSettings, PartitionFetcher, StartPosition

__all__ = [
    "EndMarks",
    "GroupDescription",
    "MemberDescription",
    "committed_offsets",
    "describe_group",
    "end_marks",
    "end_offsets",
    "lowest_durable",
    "source_topics",
    "topic_partitions",
    "topics_matching",
    "txn_versions",
]


def topics_matching(cluster: Cluster, pattern: str) -> list[str]:
    """The cluster's topics whose whole name ``pattern`` matches, internal ones excepted
    (a Metadata request for every topic)."""
    view = cluster.refresh_metadata(None)
    compiled = re.compile(pattern)
    return sorted(
        info.name
        for info in view.topics
        if not info.is_internal and not info.error_code and compiled.fullmatch(info.name)
    )


def source_topics(cluster: Cluster, topics: Iterable[str], pattern: str | None) -> list[str]:
    """``[source]``'s topics: the list, or those ``topic_pattern`` matches now."""
    return topics_matching(cluster, pattern) if pattern else sorted(set(topics))


def topic_partitions(cluster: Cluster, topics: Iterable[str]) -> list[Partition]:
    """Every partition of ``topics``; a topic the cluster does not know is an error."""
    names = sorted(set(topics))
    view = cluster.refresh_metadata(names)
    partitions: list[Partition] = []
    for name in names:
        info = view.topic(name)
        if info is None or info.error_code:
            code = info.error_code if info is not None else 3
            raise IngestError(f"topic {name!r}: {error_for(code).name} (from the cluster metadata)")
        partitions.extend(Partition(name, p.partition) for p in info.partitions)
    return sorted(partitions)


def end_offsets(
    cluster: Cluster, partitions: Iterable[Partition], settings: FetchSettings
) -> dict[Partition, int]:
    """The end of each partition now (read_committed: its last stable offset)."""
    ends: dict[Partition, int] = {}
    for partition in partitions:
        fetcher = PartitionFetcher(
            cluster, partition.topic, partition.partition, settings, start=StartPosition.earliest()
        )
        ends[partition] = fetcher.latest_offset()
    return ends


@dataclass(frozen=True)
class EndMarks:
    """Where a partition ends now: the high watermark, the last stable offset (below
    it while a transaction is open), and the newest record's timestamp (None: the
    partition is empty, or the broker is not asked MAX_TIMESTAMP)."""

    high_watermark: int
    last_stable_offset: int
    newest_timestamp: int | None

    @property
    def held_back(self) -> int:
        """Offsets an open transaction keeps from a read_committed reader."""
        return max(self.high_watermark - self.last_stable_offset, 0)


def end_marks(
    cluster: Cluster, partitions: Iterable[Partition], settings: FetchSettings
) -> dict[Partition, EndMarks]:
    """Both ends of each partition and its newest record's time. MAX_TIMESTAMP
    (ListOffsets v7+) is asked only of a broker whose ListOffsets answers are trusted:
    Tansu 0.6.0 advertises v7 but closes the connection on it."""
    wanted = sorted(set(partitions))
    high = end_offsets(cluster, wanted, replace(settings, isolation_level="read_uncommitted"))
    stable = end_offsets(cluster, wanted, replace(settings, isolation_level="read_committed"))
    newest: dict[Partition, int | None] = dict.fromkeys(wanted)
    if wanted and cluster.trusts_list_offsets():
        version = cluster.any_connection().version_for(ListOffsetsRequest.api_key)
        if version >= MAX_TIMESTAMP_MIN_VERSION:
            listed = cluster.list_offsets({p: MAX_TIMESTAMP for p in wanted}, isolation_level=0)
            newest = {p: (v.timestamp if v.offset >= 0 else None) for p, v in listed.items()}
    return {p: EndMarks(high[p], stable[p], newest[p]) for p in wanted}


def committed_offsets(
    cluster: Cluster, group: str, partitions: Iterable[Partition]
) -> dict[Partition, CommittedOffset | None]:
    """The group's committed offsets (OffsetFetch to its coordinator)."""
    wanted = sorted(set(partitions))
    if not wanted:
        return {}

    def attempt() -> dict[Partition, CommittedOffset | None]:
        coordinator = cluster.find_coordinator(group)
        connection = cluster.connection(coordinator.node_id)
        version = connection.version_for(OffsetFetchRequest.api_key)
        context = f"{connection.describe()}, OffsetFetch v{version}, group {group!r}"
        response = expect_response(
            cluster.request(connection, offset_fetch_request(group, wanted, version=version)),
            OffsetFetchResponse,
            context,
        )
        outcome = fetch_outcome(response, group, wanted)
        if outcome.error_code:
            info = error_for(outcome.error_code)
            raise BrokerError(
                info.code,
                info.name,
                outcome.retriable or info.retriable,
                context=context + (f", {outcome.detail}" if outcome.detail else ""),
            )
        return outcome.offsets

    return cluster.retrying(f"OffsetFetch of group {group!r}", attempt)


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


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: tuple[Partition, ...]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]
    coordinator: str  # "host:port (node N)"


def describe_group(cluster: Cluster, group: str) -> GroupDescription:
    """DescribeGroups at the coordinator (Tansu answers with empty member details)."""

    def attempt() -> GroupDescription:
        coordinator = cluster.find_coordinator(group)
        connection = cluster.connection(coordinator.node_id)
        version = connection.version_for(DescribeGroupsRequest.api_key)
        context = f"{connection.describe()}, DescribeGroups v{version}"
        response = expect_response(
            cluster.request(
                connection,
                DescribeGroupsRequest(groups=(group,), include_authorized_operations=False),
            ),
            DescribeGroupsResponse,
            context,
        )
        described = next((g for g in response.groups if g.group_id == group), None)
        if described is None:
            raise IngestError(f"{context}: no answer for group {group!r}")
        if described.error_code:
            info = error_for(described.error_code)
            raise BrokerError(info.code, info.name, info.retriable, context=context)
        members = []
        for member in described.members:
            assigned: tuple[Partition, ...] = ()
            if member.member_assignment:
                try:
                    decoded = decode_assignment(member.member_assignment)
                    assigned = tuple(
                        sorted(
                            Partition(tp.topic, index)
                            for tp in decoded.assigned_partitions
                            for index in tp.partitions
                        )
                    )
                except IngestError:
                    assigned = ()  # another protocol's payload: not ours to read
            members.append(
                MemberDescription(
                    member_id=member.member_id,
                    group_instance_id=member.group_instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    assignment=assigned,
                )
            )
        return GroupDescription(
            group_id=group,
            state=described.group_state,
            protocol_type=described.protocol_type,
            protocol=described.protocol_data,
            members=tuple(members),
            coordinator=f"{coordinator.host}:{coordinator.port} (node {coordinator.node_id})",
        )

    return cluster.retrying(f"DescribeGroups of {group!r}", attempt)


def committed_value(offset: CommittedOffset | None) -> int | None:
    return None if offset is None else offset.offset


def as_offsets(values: Mapping[Partition, CommittedOffset | None]) -> dict[Partition, int | None]:
    return {p: committed_value(v) for p, v in values.items()}
