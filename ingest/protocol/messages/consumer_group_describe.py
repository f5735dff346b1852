"""ConsumerGroupDescribe (api key 69) v0-1: what the coordinator knows of a KIP-848 group.

Each member's current and target assignment, by topic id and name. Version 1 adds
``member_type`` (KIP-1099: -1 unknown, 0 classic, 1 consumer); its request is v0's.
The struct names are Kafka's, which reuses ``TopicPartitions``, ``Assignment`` and
``DescribedGroup`` from other messages: ``ingest.protocol.messages`` exports these
under ``ConsumerGroupDescribe*`` names.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
    BOOL,
    INT8,
    INT16,
    INT32,
    STRING,
    UUID,
    Request,
    Response,
    Struct,
    array,
    spec,
)

__all__ = [
    "Assignment",
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "DescribedGroup",
    "Member",
    "TopicPartitions",
]

#: ``authorized_operations`` when they were not asked for.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicPartitions(Struct):
    topic_id: uuid.UUID = spec(UUID, "0+")
    topic_name: str = spec(STRING, "0+", entity="topicName")
    partitions: tuple[int, ...] = spec(array(INT32), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class Assignment(Struct):
    topic_partitions: tuple[TopicPartitions, ...] = spec(array(TopicPartitions), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class Member(Struct):
    member_id: str = spec(STRING, "0+")
    instance_id: str | None = spec(STRING, "0+", nullable="0+", default=None)
    rack_id: str | None = spec(STRING, "0+", nullable="0+", default=None)
    member_epoch: int = spec(INT32, "0+")
    client_id: str = spec(STRING, "0+")
    client_host: str = spec(STRING, "0+")
    subscribed_topic_names: tuple[str, ...] = spec(array(STRING), "0+", entity="topicName")
    subscribed_topic_regex: str | None = spec(STRING, "0+", nullable="0+", default=None)
    assignment: Assignment = spec(Assignment, "0+")
    target_assignment: Assignment = spec(Assignment, "0+")
    member_type: int = spec(INT8, "1+", default=-1, ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class DescribedGroup(Struct):
    error_code: int = spec(INT16, "0+")
    error_message: str | None = spec(STRING, "0+", nullable="0+", default=None)
    group_id: str = spec(STRING, "0+", entity="groupId")
    group_state: str = spec(STRING, "0+")
    group_epoch: int = spec(INT32, "0+")
    assignment_epoch: int = spec(INT32, "0+")
    assignor_name: str = spec(STRING, "0+")
    members: tuple[Member, ...] = spec(array(Member), "0+")
    authorized_operations: int = spec(INT32, "0+", default=AUTHORIZED_OPERATIONS_OMITTED)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerGroupDescribeResponse(Response):
    api_key: ClassVar[int] = 69
    valid_versions: ClassVar[str] = "0-1"
    flexible_versions: ClassVar[str] = "0+"

    throttle_time_ms: int = spec(INT32, "0+")
    groups: tuple[DescribedGroup, ...] = spec(array(DescribedGroup), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerGroupDescribeRequest(Request):
    api_key: ClassVar[int] = 69
    valid_versions: ClassVar[str] = "0-1"
    flexible_versions: ClassVar[str] = "0+"
    response_type: ClassVar[type[Response]] = ConsumerGroupDescribeResponse

    group_ids: tuple[str, ...] = spec(array(STRING), "0+", entity="groupId")
    include_authorized_operations: bool = spec(BOOL, "0+")
