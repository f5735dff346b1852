"""The consumer group protocol of KIP-848: ConsumerGroupHeartbeat (api key 68) v0-1.

One request does what JoinGroup, SyncGroup, Heartbeat and LeaveGroup do in the
classic protocol: ``member_epoch`` 0 joins, -1 leaves, -2 leaves for a static member
that will come back (KIP-848); the coordinator computes the assignment itself
(``server_assignor``) and hands each member its partitions by topic id.

Most request fields are "null if it didn't change since the last heartbeat": a
member sends them all when it (re)joins and afterwards only what changed. Version
1 adds ``subscribed_topic_regex`` and lets the member generate its own member id
(KIP-1082). Both versions are flexible.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
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
    "LEAVE_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_STATIC_MEMBER_EPOCH",
    "Assignment",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
    "TopicPartitions",
]

#: ``member_epoch`` of a member leaving the group for good.
LEAVE_GROUP_MEMBER_EPOCH = -1
#: ``member_epoch`` of a static member leaving for a restart: the coordinator keeps its
#: assignment until the session times out.
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicPartitions(Struct):
    """Partitions of one topic, named by topic id (the request's and the response's are alike)."""

    topic_id: uuid.UUID = spec(UUID, "0+")
    partitions: tuple[int, ...] = spec(array(INT32), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class Assignment(Struct):
    """The partitions the member may use now (those still owned elsewhere come later)."""

    topic_partitions: tuple[TopicPartitions, ...] = spec(array(TopicPartitions), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerGroupHeartbeatResponse(Response):
    api_key: ClassVar[int] = 68
    valid_versions: ClassVar[str] = "0-1"
    flexible_versions: ClassVar[str] = "0+"

    throttle_time_ms: int = spec(INT32, "0+")
    error_code: int = spec(INT16, "0+")
    error_message: str | None = spec(STRING, "0+", nullable="0+", default=None)
    member_id: str | None = spec(STRING, "0+", nullable="0+", default=None)
    member_epoch: int = spec(INT32, "0+")
    heartbeat_interval_ms: int = spec(INT32, "0+")
    assignment: Assignment | None = spec(Assignment, "0+", nullable="0+", default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerGroupHeartbeatRequest(Request):
    api_key: ClassVar[int] = 68
    valid_versions: ClassVar[str] = "0-1"
    flexible_versions: ClassVar[str] = "0+"
    response_type: ClassVar[type[Response]] = ConsumerGroupHeartbeatResponse

    group_id: str = spec(STRING, "0+", entity="groupId")
    member_id: str = spec(STRING, "0+")
    member_epoch: int = spec(INT32, "0+")
    instance_id: str | None = spec(STRING, "0+", nullable="0+", default=None)
    rack_id: str | None = spec(STRING, "0+", nullable="0+", default=None)
    rebalance_timeout_ms: int = spec(INT32, "0+", default=-1)
    subscribed_topic_names: tuple[str, ...] | None = spec(
        array(STRING), "0+", nullable="0+", default=None, entity="topicName"
    )
    subscribed_topic_regex: str | None = spec(STRING, "1+", nullable="1+", default=None)
    server_assignor: str | None = spec(STRING, "0+", nullable="0+", default=None)
    topic_partitions: tuple[TopicPartitions, ...] | None = spec(
        array(TopicPartitions), "0+", nullable="0+", default=None
    )
