"""The classic protocol's requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) built for a
given version, the assignment payload the leader sends, and the JoinGroup and SyncGroup
answers' protocol and assignment read back. Pure functions; as in ``requests.py``,
each request encodes at the version it was built for (group.instance.id is left out
before JoinGroup v5, SyncGroup and Heartbeat v3, LeaveGroup v3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ingest.errors import DecodeError, RemoteProtocolError
from ingest.group.assignors import Assignor, MemberAssignment
from ingest.group.classic.classic_config import GroupConfig
from ingest.group.requests import topic_partitions
from ingest.protocol.consumer import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    decode_assignment,
    encode_assignment,
    encode_subscription,
)
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberIdentity,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
    SyncGroupResponse,
)
from ingest.protocol.partition import Partition

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "STATIC_JOIN_VERSION",
    "encode_member_assignment",
    "heartbeat_request",
    "join_group_request",
    "join_protocol_error",
    "leave_group_request",
    "read_assignment",
    "sync_group_request",
    "sync_protocol_error",
]

CONSUMER_PROTOCOL_TYPE = "consumer"
PAYLOAD_VERSION = 3  # ConsumerProtocolSubscription / ConsumerProtocolAssignment, as Kafka sends
STATIC_JOIN_VERSION = 5  # JoinGroup carries group.instance.id from v5 (KIP-345)


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


def join_protocol_error(response: JoinGroupResponse, config: GroupConfig) -> str | None:
    """Why a JoinGroup answer's protocol is not one we offered; None when it is."""
    if response.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE):
        return (
            f"JoinGroup: protocol type {response.protocol_type!r}, "
            f"expected {CONSUMER_PROTOCOL_TYPE!r}"
        )
    name = response.protocol_name
    if name is None or config.assignor(name) is None:
        offered = [a.name for a in config.assignors]
        return f"JoinGroup: the coordinator chose assignor {name!r}; we offered {offered}"
    return None


def sync_protocol_error(response: SyncGroupResponse, protocol_name: str | None) -> str | None:
    """Why a SyncGroup answer's protocol is not the one we joined with; None when it is."""
    if response.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE) or (
        response.protocol_name is not None and response.protocol_name != protocol_name
    ):
        return (
            f"SyncGroup answered protocol {response.protocol_type}/{response.protocol_name},"
            f" we joined with {CONSUMER_PROTOCOL_TYPE}/{protocol_name}"
        )
    return None


def read_assignment(data: bytes) -> tuple[frozenset[Partition], bytes | None]:
    """The partitions and user_data of the leader's assignment (SyncGroup's answer).

    An empty assignment is what a leader gives a member it assigned nothing.
    ``RemoteProtocolError`` when it is unreadable.
    """
    if not data:
        return frozenset(), None
    try:
        payload = decode_assignment(data)
    except DecodeError as exc:
        raise RemoteProtocolError(
            f"the leader's SyncGroup assignment is unreadable: {exc}"
        ) from exc
    assigned = frozenset(
        Partition(tp.topic, i) for tp in payload.assigned_partitions for i in tp.partitions
    )
    return assigned, payload.user_data
