"""Fetch (api key 1), versions 4-12.

``PartitionData.records`` is a zero-copy memoryview slice of the response
frame: the record batches are decoded by ``ingest.protocol.recordbatch.records``.
Fields of versions 13+ (topic ids, replica state, node endpoints) are not declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.schema import (
    INT8,
    INT16,
    INT32,
    INT64,
    RECORDS,
    STRING,
    Request,
    Response,
    Struct,
    array,
    spec,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochEndOffset(Struct):
    epoch: int = spec(INT32, "12+", default=-1)
    end_offset: int = spec(INT64, "12+", default=-1)


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderIdAndEpoch(Struct):
    leader_id: int = spec(INT32, "12+", entity="brokerId", default=-1)
    leader_epoch: int = spec(INT32, "12+", default=-1)


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotId(Struct):
    end_offset: int = spec(INT64, "0+", default=-1)
    epoch: int = spec(INT32, "0+", default=-1)


@dataclass(frozen=True, kw_only=True, slots=True)
class AbortedTransaction(Struct):
    producer_id: int = spec(INT64, "4+", entity="producerId")
    first_offset: int = spec(INT64, "4+")


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionData(Struct):
    partition_index: int = spec(INT32, "0+")
    error_code: int = spec(INT16, "0+")
    high_watermark: int = spec(INT64, "0+")
    last_stable_offset: int = spec(INT64, "4+", default=-1, ignorable=True)
    log_start_offset: int = spec(INT64, "5+", default=-1, ignorable=True)
    diverging_epoch: EpochEndOffset = spec(EpochEndOffset, "12+", tag=0)
    current_leader: LeaderIdAndEpoch = spec(LeaderIdAndEpoch, "12+", tag=1)
    snapshot_id: SnapshotId = spec(SnapshotId, "12+", tag=2)
    aborted_transactions: tuple[AbortedTransaction, ...] | None = spec(
        array(AbortedTransaction), "4+", nullable="4+", ignorable=True
    )
    preferred_read_replica: int = spec(INT32, "11+", entity="brokerId", default=-1)
    records: memoryview | bytes | None = spec(RECORDS, "0+", nullable="0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchableTopicResponse(Struct):
    topic: str = spec(STRING, "0-12", entity="topicName", ignorable=True)
    partitions: tuple[PartitionData, ...] = spec(array(PartitionData), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchResponse(Response):
    api_key: ClassVar[int] = 1
    valid_versions: ClassVar[str] = "4-12"
    flexible_versions: ClassVar[str] = "12+"

    throttle_time_ms: int = spec(INT32, "1+", ignorable=True)
    error_code: int = spec(INT16, "7+", ignorable=True)
    session_id: int = spec(INT32, "7+", default=0)
    responses: tuple[FetchableTopicResponse, ...] = spec(array(FetchableTopicResponse), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchPartition(Struct):
    partition: int = spec(INT32, "0+")
    current_leader_epoch: int = spec(INT32, "9+", default=-1, ignorable=True)
    fetch_offset: int = spec(INT64, "0+")
    last_fetched_epoch: int = spec(INT32, "12+", default=-1)
    log_start_offset: int = spec(INT64, "5+", default=-1, ignorable=True)
    partition_max_bytes: int = spec(INT32, "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchTopic(Struct):
    topic: str = spec(STRING, "0-12", entity="topicName", ignorable=True)
    partitions: tuple[FetchPartition, ...] = spec(array(FetchPartition), "0+")


@dataclass(frozen=True, kw_only=True, slots=True)
class ForgottenTopic(Struct):
    topic: str = spec(STRING, "7-12", entity="topicName", ignorable=True)
    partitions: tuple[int, ...] = spec(array(INT32), "7+")


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchRequest(Request):
    api_key: ClassVar[int] = 1
    valid_versions: ClassVar[str] = "4-12"
    flexible_versions: ClassVar[str] = "12+"
    response_type: ClassVar[type[Response]] = FetchResponse

    cluster_id: str | None = spec(
        STRING, "12+", nullable="12+", tag=0, default=None, ignorable=True
    )
    replica_id: int = spec(INT32, "0-14", entity="brokerId", default=-1)
    max_wait_ms: int = spec(INT32, "0+")
    min_bytes: int = spec(INT32, "0+")
    max_bytes: int = spec(INT32, "3+", default=0x7FFFFFFF, ignorable=True)
    isolation_level: int = spec(INT8, "4+", default=0, ignorable=True)
    session_id: int = spec(INT32, "7+", default=0, ignorable=True)
    session_epoch: int = spec(INT32, "7+", default=-1, ignorable=True)
    topics: tuple[FetchTopic, ...] = spec(array(FetchTopic), "0+")
    forgotten_topics_data: tuple[ForgottenTopic, ...] = spec(array(ForgottenTopic), "7+")
    rack_id: str = spec(STRING, "11+", default="", ignorable=True)
