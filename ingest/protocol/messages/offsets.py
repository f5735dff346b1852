"""Committed offsets: OffsetFetch (api key 9) v1-8 and OffsetCommit (api key 8) v2-9.

OffsetCommit v9 is v8 on the wire; a member of a KIP-848 (consumer protocol) group must
use it, with its member epoch in ``generation_id_or_member_epoch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
    BOOL,
    INT16,
    INT32,
    INT64,
    STRING,
    Request,
    Response,
    Struct,
    array,
    spec,
)

# -- OffsetFetch -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchResponsePartition(Struct):
    partition_index: int = spec(INT32, "0-7")
    committed_offset: int = spec(INT64, "0-7")
    committed_leader_epoch: int = spec(INT32, "5-7", default=-1, ignorable=True)
    metadata: str | None = spec(STRING, "0-7", nullable="0-7")
    error_code: int = spec(INT16, "0-7")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchResponseTopic(Struct):
    name: str = spec(STRING, "0-7", entity="topicName")
    partitions: tuple[OffsetFetchResponsePartition, ...] = spec(
        array(OffsetFetchResponsePartition), "0-7"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchResponsePartitions(Struct):
    partition_index: int = spec(INT32, "8+")
    committed_offset: int = spec(INT64, "8+")
    committed_leader_epoch: int = spec(INT32, "8+", default=-1, ignorable=True)
    metadata: str | None = spec(STRING, "8+", nullable="8+")
    error_code: int = spec(INT16, "8+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchResponseTopics(Struct):
    name: str = spec(STRING, "8-9", entity="topicName", ignorable=True)
    partitions: tuple[OffsetFetchResponsePartitions, ...] = spec(
        array(OffsetFetchResponsePartitions), "8+"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchResponseGroup(Struct):
    group_id: str = spec(STRING, "8+", entity="groupId")
    topics: tuple[OffsetFetchResponseTopics, ...] = spec(array(OffsetFetchResponseTopics), "8+")
    error_code: int = spec(INT16, "8+", default=0)


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchResponse(Response):
    """Versions 1-7 answer for one group (``topics``); v8 per group (``groups``)."""

    api_key: ClassVar[int] = 9
    valid_versions: ClassVar[str] = "1-8"
    flexible_versions: ClassVar[str] = "6+"

    throttle_time_ms: int = spec(INT32, "3+", ignorable=True)
    topics: tuple[OffsetFetchResponseTopic, ...] = spec(array(OffsetFetchResponseTopic), "0-7")
    error_code: int = spec(INT16, "2-7", default=0, ignorable=True)
    groups: tuple[OffsetFetchResponseGroup, ...] = spec(array(OffsetFetchResponseGroup), "8+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchRequestTopic(Struct):
    name: str = spec(STRING, "0-7", entity="topicName")
    partition_indexes: tuple[int, ...] = spec(array(INT32), "0-7")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchRequestTopics(Struct):
    name: str = spec(STRING, "8-9", entity="topicName", ignorable=True)
    partition_indexes: tuple[int, ...] = spec(array(INT32), "8+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchRequestGroup(Struct):
    """``topics=None`` asks for every partition the group has committed."""

    group_id: str = spec(STRING, "8+", entity="groupId")
    topics: tuple[OffsetFetchRequestTopics, ...] | None = spec(
        array(OffsetFetchRequestTopics), "8+", nullable="8+"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetFetchRequest(Request):
    """Versions 1-7 ask for one group (``group_id``, ``topics``); v8 batches ``groups``."""

    api_key: ClassVar[int] = 9
    valid_versions: ClassVar[str] = "1-8"
    flexible_versions: ClassVar[str] = "6+"
    response_type: ClassVar[type[Response]] = OffsetFetchResponse

    group_id: str = spec(STRING, "0-7", entity="groupId")
    topics: tuple[OffsetFetchRequestTopic, ...] | None = spec(
        array(OffsetFetchRequestTopic), "0-7", nullable="2-7"
    )
    groups: tuple[OffsetFetchRequestGroup, ...] = spec(array(OffsetFetchRequestGroup), "8+")
    require_stable: bool = spec(BOOL, "7+", default=False)


# -- OffsetCommit ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetCommitResponsePartition(Struct):
    partition_index: int = spec(INT32, "0+")
    error_code: int = spec(INT16, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetCommitResponseTopic(Struct):
    name: str = spec(STRING, "0-9", entity="topicName", ignorable=True)
    partitions: tuple[OffsetCommitResponsePartition, ...] = spec(
        array(OffsetCommitResponsePartition), "0+"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetCommitResponse(Response):
    api_key: ClassVar[int] = 8
    valid_versions: ClassVar[str] = "2-9"
    flexible_versions: ClassVar[str] = "8+"

    throttle_time_ms: int = spec(INT32, "3+", ignorable=True)
    topics: tuple[OffsetCommitResponseTopic, ...] = spec(array(OffsetCommitResponseTopic), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetCommitRequestPartition(Struct):
    partition_index: int = spec(INT32, "0+")
    committed_offset: int = spec(INT64, "0+")
    committed_leader_epoch: int = spec(INT32, "6+", default=-1, ignorable=True)
    committed_metadata: str | None = spec(STRING, "0+", nullable="0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetCommitRequestTopic(Struct):
    name: str = spec(STRING, "0-9", entity="topicName", ignorable=True)
    partitions: tuple[OffsetCommitRequestPartition, ...] = spec(
        array(OffsetCommitRequestPartition), "0+"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OffsetCommitRequest(Request):
    api_key: ClassVar[int] = 8
    valid_versions: ClassVar[str] = "2-9"
    flexible_versions: ClassVar[str] = "8+"
    response_type: ClassVar[type[Response]] = OffsetCommitResponse

    group_id: str = spec(STRING, "0+", entity="groupId")
    generation_id_or_member_epoch: int = spec(INT32, "1+", default=-1, ignorable=True)
    member_id: str = spec(STRING, "1+", ignorable=True)
    group_instance_id: str | None = spec(STRING, "7+", nullable="7+", default=None)
    retention_time_ms: int = spec(INT64, "2-4", default=-1, ignorable=True)
    topics: tuple[OffsetCommitRequestTopic, ...] = spec(array(OffsetCommitRequestTopic), "0+")
