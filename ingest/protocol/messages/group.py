"""Group coordination: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, DescribeGroups and ListGroups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    STRING,
    Request,
    Response,
    Struct,
    array,
    spec,
)

# FindCoordinator key types.
COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1

# -- FindCoordinator (api key 10), versions 1-4 ---------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Coordinator(Struct):
    key: str = spec(STRING, "4+")
    node_id: int = spec(INT32, "4+", entity="brokerId")
    host: str = spec(STRING, "4+")
    port: int = spec(INT32, "4+")
    error_code: int = spec(INT16, "4+")
    error_message: str | None = spec(STRING, "4+", nullable="4+", ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class FindCoordinatorResponse(Response):
    """Versions 1-3 answer for one key at the top level; v4 answers per key in ``coordinators``."""

    api_key: ClassVar[int] = 10
    valid_versions: ClassVar[str] = "1-4"
    flexible_versions: ClassVar[str] = "3+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    error_code: int = spec(INT16, "0-3")
    error_message: str | None = spec(STRING, "1-3", nullable="1-3", ignorable=True)
    node_id: int = spec(INT32, "0-3", entity="brokerId")
    host: str = spec(STRING, "0-3")
    port: int = spec(INT32, "0-3")
    coordinators: tuple[Coordinator, ...] = spec(array(Coordinator), "4+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FindCoordinatorRequest(Request):
    """Versions 1-3 carry one ``key``; v4 batches them in ``coordinator_keys``."""

    api_key: ClassVar[int] = 10
    valid_versions: ClassVar[str] = "1-4"
    flexible_versions: ClassVar[str] = "3+"
    response_type: ClassVar[type[Response]] = FindCoordinatorResponse

    key: str = spec(STRING, "0-3")
    key_type: int = spec(INT8, "1+", default=0)
    coordinator_keys: tuple[str, ...] = spec(array(STRING), "4+")


# -- JoinGroup (api key 11), versions 2-9 ------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinGroupResponseMember(Struct):
    member_id: str = spec(STRING, "0+")
    group_instance_id: str | None = spec(STRING, "5+", nullable="5+", default=None, ignorable=True)
    metadata: bytes = spec(BYTES, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinGroupResponse(Response):
    api_key: ClassVar[int] = 11
    valid_versions: ClassVar[str] = "2-9"
    flexible_versions: ClassVar[str] = "6+"

    throttle_time_ms: int = spec(INT32, "2+", ignorable=True)
    error_code: int = spec(INT16, "0+")
    generation_id: int = spec(INT32, "0+", default=-1)
    protocol_type: str | None = spec(STRING, "7+", nullable="7+", default=None, ignorable=True)
    protocol_name: str | None = spec(STRING, "0+", nullable="7+")
    leader: str = spec(STRING, "0+")
    skip_assignment: bool = spec(BOOL, "9+", default=False)
    member_id: str = spec(STRING, "0+")
    members: tuple[JoinGroupResponseMember, ...] = spec(array(JoinGroupResponseMember), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinGroupRequestProtocol(Struct):
    name: str = spec(STRING, "0+")
    metadata: bytes = spec(BYTES, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinGroupRequest(Request):
    api_key: ClassVar[int] = 11
    valid_versions: ClassVar[str] = "2-9"
    flexible_versions: ClassVar[str] = "6+"
    response_type: ClassVar[type[Response]] = JoinGroupResponse

    group_id: str = spec(STRING, "0+", entity="groupId")
    session_timeout_ms: int = spec(INT32, "0+")
    rebalance_timeout_ms: int = spec(INT32, "1+", default=-1, ignorable=True)
    member_id: str = spec(STRING, "0+")
    group_instance_id: str | None = spec(STRING, "5+", nullable="5+", default=None)
    protocol_type: str = spec(STRING, "0+")
    protocols: tuple[JoinGroupRequestProtocol, ...] = spec(array(JoinGroupRequestProtocol), "0+")
    reason: str | None = spec(STRING, "8+", nullable="8+", default=None, ignorable=True)


# -- SyncGroup (api key 14), versions 1-5 ------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncGroupResponse(Response):
    api_key: ClassVar[int] = 14
    valid_versions: ClassVar[str] = "1-5"
    flexible_versions: ClassVar[str] = "4+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    error_code: int = spec(INT16, "0+")
    protocol_type: str | None = spec(STRING, "5+", nullable="5+", default=None, ignorable=True)
    protocol_name: str | None = spec(STRING, "5+", nullable="5+", default=None, ignorable=True)
    assignment: bytes = spec(BYTES, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncGroupRequestAssignment(Struct):
    member_id: str = spec(STRING, "0+")
    assignment: bytes = spec(BYTES, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncGroupRequest(Request):
    api_key: ClassVar[int] = 14
    valid_versions: ClassVar[str] = "1-5"
    flexible_versions: ClassVar[str] = "4+"
    response_type: ClassVar[type[Response]] = SyncGroupResponse

    group_id: str = spec(STRING, "0+", entity="groupId")
    generation_id: int = spec(INT32, "0+")
    member_id: str = spec(STRING, "0+")
    group_instance_id: str | None = spec(STRING, "3+", nullable="3+", default=None)
    protocol_type: str | None = spec(STRING, "5+", nullable="5+", default=None, ignorable=True)
    protocol_name: str | None = spec(STRING, "5+", nullable="5+", default=None, ignorable=True)
    assignments: tuple[SyncGroupRequestAssignment, ...] = spec(
        array(SyncGroupRequestAssignment), "0+"
    )


# -- Heartbeat (api key 12), versions 1-4 ------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatResponse(Response):
    api_key: ClassVar[int] = 12
    valid_versions: ClassVar[str] = "1-4"
    flexible_versions: ClassVar[str] = "4+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    error_code: int = spec(INT16, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatRequest(Request):
    api_key: ClassVar[int] = 12
    valid_versions: ClassVar[str] = "1-4"
    flexible_versions: ClassVar[str] = "4+"
    response_type: ClassVar[type[Response]] = HeartbeatResponse

    group_id: str = spec(STRING, "0+", entity="groupId")
    generation_id: int = spec(INT32, "0+")
    member_id: str = spec(STRING, "0+")
    group_instance_id: str | None = spec(STRING, "3+", nullable="3+", default=None)


# -- LeaveGroup (api key 13), versions 1-5 -----------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class MemberResponse(Struct):
    member_id: str = spec(STRING, "3+")
    group_instance_id: str | None = spec(STRING, "3+", nullable="3+")
    error_code: int = spec(INT16, "3+")


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaveGroupResponse(Response):
    api_key: ClassVar[int] = 13
    valid_versions: ClassVar[str] = "1-5"
    flexible_versions: ClassVar[str] = "4+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    error_code: int = spec(INT16, "0+")
    members: tuple[MemberResponse, ...] = spec(array(MemberResponse), "3+")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemberIdentity(Struct):
    member_id: str = spec(STRING, "3+")
    group_instance_id: str | None = spec(STRING, "3+", nullable="3+", default=None)
    reason: str | None = spec(STRING, "5+", nullable="5+", default=None, ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaveGroupRequest(Request):
    """Versions 1-2 leave with one ``member_id``; v3+ with a batch of ``members``."""

    api_key: ClassVar[int] = 13
    valid_versions: ClassVar[str] = "1-5"
    flexible_versions: ClassVar[str] = "4+"
    response_type: ClassVar[type[Response]] = LeaveGroupResponse

    group_id: str = spec(STRING, "0+", entity="groupId")
    member_id: str = spec(STRING, "0-2")
    members: tuple[MemberIdentity, ...] = spec(array(MemberIdentity), "3+")


# -- DescribeGroups (api key 15), versions 1-5 -------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class DescribedGroupMember(Struct):
    member_id: str = spec(STRING, "0+")
    group_instance_id: str | None = spec(STRING, "4+", nullable="4+", default=None, ignorable=True)
    client_id: str = spec(STRING, "0+")
    client_host: str = spec(STRING, "0+")
    member_metadata: bytes = spec(BYTES, "0+")
    member_assignment: bytes = spec(BYTES, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class DescribedGroup(Struct):
    error_code: int = spec(INT16, "0+")
    group_id: str = spec(STRING, "0+", entity="groupId")
    group_state: str = spec(STRING, "0+")
    protocol_type: str = spec(STRING, "0+")
    protocol_data: str = spec(STRING, "0+")
    members: tuple[DescribedGroupMember, ...] = spec(array(DescribedGroupMember), "0+")
    authorized_operations: int = spec(INT32, "3+", default=-(2**31))


@dataclass(frozen=True, kw_only=True, slots=True)
class DescribeGroupsResponse(Response):
    api_key: ClassVar[int] = 15
    valid_versions: ClassVar[str] = "1-5"
    flexible_versions: ClassVar[str] = "5+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    groups: tuple[DescribedGroup, ...] = spec(array(DescribedGroup), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class DescribeGroupsRequest(Request):
    api_key: ClassVar[int] = 15
    valid_versions: ClassVar[str] = "1-5"
    flexible_versions: ClassVar[str] = "5+"
    response_type: ClassVar[type[Response]] = DescribeGroupsResponse

    groups: tuple[str, ...] = spec(array(STRING), "0+", entity="groupId")
    include_authorized_operations: bool = spec(BOOL, "3+")


# -- ListGroups (api key 16), versions 1-4 -----------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ListedGroup(Struct):
    group_id: str = spec(STRING, "0+", entity="groupId")
    protocol_type: str = spec(STRING, "0+")
    group_state: str = spec(STRING, "4+", ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class ListGroupsResponse(Response):
    api_key: ClassVar[int] = 16
    valid_versions: ClassVar[str] = "1-4"
    flexible_versions: ClassVar[str] = "3+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    error_code: int = spec(INT16, "0+")
    groups: tuple[ListedGroup, ...] = spec(array(ListedGroup), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ListGroupsRequest(Request):
    api_key: ClassVar[int] = 16
    valid_versions: ClassVar[str] = "1-4"
    flexible_versions: ClassVar[str] = "3+"
    response_type: ClassVar[type[Response]] = ListGroupsResponse

    states_filter: tuple[str, ...] = spec(array(STRING), "4+")
