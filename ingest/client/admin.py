"""Admin reads on a ``Cluster`` the caller owns: the topics a pattern matches, a topic's
partitions, and a group's description (DescribeGroups). No group membership is needed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ingest.client.cluster import Cluster
from ingest.client.connection import expect_response
from ingest.errors import BrokerError, IngestError
from ingest.protocol.consumer import decode_assignment
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import DescribeGroupsRequest, DescribeGroupsResponse
from ingest.protocol.partition import Partition

__all__ = [
    "GroupDescription",
    "MemberDescription",
    "describe_group",
    "source_topics",
    "topic_partitions",
    "topics_matching",
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
