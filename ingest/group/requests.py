"""The requests and answers both protocols share: OffsetCommit and OffsetFetch built for a
given version, their answers read, and partitions grouped by topic.

Fields a version cannot carry are left at their defaults (group.instance.id
before the version that added it), so every request here encodes at the
version it was built for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ingest.group.events import CommittedOffset
from ingest.group.types import partitions_by_topic
from ingest.protocol.consumer import TopicPartition
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    OffsetFetchResponse,
)
from ingest.protocol.partition import Partition

__all__ = [
    "FetchOutcome",
    "GroupIdentity",
    "commit_error",
    "fetch_outcome",
    "offset_commit_request",
    "offset_fetch_request",
    "topic_partitions",
]


def topic_partitions(partitions: Iterable[Partition]) -> tuple[TopicPartition, ...]:
    return tuple(
        TopicPartition(topic=topic, partitions=tuple(indexes))
        for topic, indexes in partitions_by_topic(partitions).items()
    )


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
