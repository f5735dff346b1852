"""Building group requests for a given version, and reading offset responses.

Fields a version cannot carry are left at their defaults (group.instance.id
before the version that added it), so every request here encodes at the
version it was built for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ingest.group.assignors import Assignor, MemberAssignment
from ingest.group.config import GroupConfig
from ingest.group.events import CommittedOffset
from ingest.group.types import Partition, partitions_by_topic
from ingest.protocol.consumer import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    TopicPartition,
    encode_assignment,
    encode_subscription,
)
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    MemberIdentity,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "FetchOutcome",
    "GroupIdentity",
    "commit_error",
    "encode_member_assignment",
    "fetch_outcome",
    "heartbeat_request",
    "join_group_request",
    "leave_group_request",
    "offset_commit_request",
    "offset_fetch_request",
    "sync_group_request",
    "topic_partitions",
]

CONSUMER_PROTOCOL_TYPE = "consumer"
PAYLOAD_VERSION = 3  # ConsumerProtocolSubscription / ConsumerProtocolAssignment, as Kafka sends
STATIC_JOIN_VERSION = 5  # JoinGroup carries group.instance.id from v5 (KIP-345)


def topic_partitions(partitions: Iterable[Partition]) -> tuple[TopicPartition, ...]:
    return tuple(
        TopicPartition(topic=topic, partitions=tuple(indexes))
        for topic, indexes in partitions_by_topic(partitions).items()
    )


def join_group_request(
    config: GroupConfig,
    *,
    member_id: str,
    topics: Iterable[str],
    owned: Iterable[Partition],
    generation_id: int,
    reason: str,
    version: int,
) -> JoinGroupRequest:
    owned_partitions = topic_partitions(owned)
    sorted_topics = tuple(sorted(topics))

    def metadata(assignor: Assignor) -> bytes:
        subscription = ConsumerProtocolSubscription(
            topics=sorted_topics,
            user_data=assignor.subscription_user_data(generation_id),
            owned_partitions=owned_partitions,
            generation_id=generation_id,
        )
        return encode_subscription(subscription, PAYLOAD_VERSION)

    return JoinGroupRequest(
        group_id=config.group_id,
        session_timeout_ms=config.session_timeout_ms,
        rebalance_timeout_ms=config.rebalance_timeout_ms,
        member_id=member_id,
        group_instance_id=config.group_instance_id if version >= STATIC_JOIN_VERSION else None,
        protocol_type=CONSUMER_PROTOCOL_TYPE,
        protocols=tuple(
            JoinGroupRequestProtocol(name=a.name, metadata=metadata(a)) for a in config.assignors
        ),
        reason=reason,
    )


def encode_member_assignment(assignment: MemberAssignment) -> bytes:
    payload = ConsumerProtocolAssignment(
        assigned_partitions=topic_partitions(assignment.partitions),
        user_data=assignment.user_data,
    )
    return encode_assignment(payload, PAYLOAD_VERSION)


def sync_group_request(
    config: GroupConfig,
    *,
    generation_id: int,
    member_id: str,
    protocol_name: str | None,
    assignments: Mapping[str, bytes],
    version: int,
) -> SyncGroupRequest:
    return SyncGroupRequest(
        group_id=config.group_id,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=config.group_instance_id if version >= 3 else None,
        protocol_type=CONSUMER_PROTOCOL_TYPE,
        protocol_name=protocol_name,
        assignments=tuple(
            SyncGroupRequestAssignment(member_id=member, assignment=data)
            for member, data in sorted(assignments.items())
        ),
    )


def heartbeat_request(
    config: GroupConfig, *, generation_id: int, member_id: str, version: int
) -> HeartbeatRequest:
    return HeartbeatRequest(
        group_id=config.group_id,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=config.group_instance_id if version >= 3 else None,
    )


def leave_group_request(
    config: GroupConfig, *, member_id: str, reason: str, version: int
) -> LeaveGroupRequest:
    if version < 3:
        return LeaveGroupRequest(group_id=config.group_id, member_id=member_id)
    identity = MemberIdentity(
        member_id=member_id, group_instance_id=config.group_instance_id, reason=reason
    )
    return LeaveGroupRequest(group_id=config.group_id, members=(identity,))


class GroupIdentity(Protocol):
    """What an OffsetCommit names of its member: ``GroupConfig`` or ``ConsumerGroupConfig``."""

    @property
    def group_id(self) -> str: ...

    @property
    def group_instance_id(self) -> str | None: ...


def offset_commit_request(
    config: GroupIdentity,
    *,
    generation_id: int,
    member_id: str,
    offsets: Mapping[Partition, int],
    metadata: str | None,
    version: int,
    leader_epochs: Mapping[Partition, int] | None = None,
) -> OffsetCommitRequest:
    """``leader_epochs`` go out as ``committed_leader_epoch`` from v6 (older versions have
    no such field, and the codec leaves it out)."""
    epochs = leader_epochs or {}
    topics = tuple(
        OffsetCommitRequestTopic(
            name=topic,
            partitions=tuple(
                OffsetCommitRequestPartition(
                    partition_index=index,
                    committed_offset=offsets[Partition(topic, index)],
                    committed_leader_epoch=epochs.get(Partition(topic, index), -1),
                    committed_metadata=metadata,
                )
                for index in indexes
            ),
        )
        for topic, indexes in partitions_by_topic(offsets).items()
    )
    return OffsetCommitRequest(
        group_id=config.group_id,
        generation_id_or_member_epoch=generation_id,
        member_id=member_id,
        group_instance_id=config.group_instance_id if version >= 7 else None,
        topics=topics,
    )


def offset_fetch_request(
    group_id: str, partitions: Iterable[Partition], *, version: int
) -> OffsetFetchRequest:
    grouped = partitions_by_topic(partitions)
    if version >= 8:
        group = OffsetFetchRequestGroup(
            group_id=group_id,
            topics=tuple(
                OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
                for t, ps in grouped.items()
            ),
        )
        return OffsetFetchRequest(groups=(group,), require_stable=True)
    return OffsetFetchRequest(
        group_id=group_id,
        topics=tuple(
            OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps))
            for t, ps in grouped.items()
        ),
        # Only ask for stable offsets where the version can (v7+).
        require_stable=version >= 7,
    )


def commit_error(response: OffsetCommitResponse) -> int:
    """The error that decides the commit, in Kafka's order; 0 when every partition succeeded.

    As in Kafka, the first failing partition decides, except that topic
    authorization failures are reported only when nothing else failed.
    """
    authorization = 0
    for topic in response.topics:
        for partition in topic.partitions:
            code = partition.error_code
            if code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                authorization = code
            elif code != 0:
                return code
    return authorization


@dataclass(frozen=True)
class FetchOutcome:
    """OffsetFetch read: either ``offsets`` or an error (code and whether it is retriable)."""

    offsets: dict[Partition, CommittedOffset | None]
    error_code: int = 0
    retriable: bool = False
    detail: str = ""


_FETCH_PARTITION_RETRIABLE = {ErrorCode.UNSTABLE_OFFSET_COMMIT}


def fetch_outcome(
    response: OffsetFetchResponse, group_id: str, requested: Iterable[Partition]
) -> FetchOutcome:
    """Read an OffsetFetch answer (any version) for ``requested`` of ``group_id``."""
    rows: list[tuple[str, int, int, int, str | None, int]] = []
    if response.groups:
        group = next((g for g in response.groups if g.group_id == group_id), None)
        if group is None:
            return FetchOutcome({}, ErrorCode.INVALID_REQUEST, False, f"no answer for {group_id}")
        group_error = group.error_code
        for topic in group.topics:
            rows.extend(
                (
                    topic.name,
                    p.partition_index,
                    p.committed_offset,
                    p.committed_leader_epoch,
                    p.metadata,
                    p.error_code,
                )
                for p in topic.partitions
            )
    else:
        group_error = response.error_code
        for old_topic in response.topics:
            rows.extend(
                (
                    old_topic.name,
                    p.partition_index,
                    p.committed_offset,
                    p.committed_leader_epoch,
                    p.metadata,
                    p.error_code,
                )
                for p in old_topic.partitions
            )
    if group_error:
        return FetchOutcome({}, group_error, error_for(group_error).retriable)

    offsets: dict[Partition, CommittedOffset | None] = dict.fromkeys(requested)
    for topic_name, index, offset, epoch, metadata, code in rows:
        partition = Partition(topic_name, index)
        if code:
            retriable = code in _FETCH_PARTITION_RETRIABLE
            return FetchOutcome({}, code, retriable, f"partition {partition}")
        offsets[partition] = (
            CommittedOffset(offset=offset, metadata=metadata, leader_epoch=epoch)
            if offset >= 0
            else None
        )
    return FetchOutcome(offsets)
