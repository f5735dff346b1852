"""Metadata (api key 3), versions 1-12."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar

from ingest.protocol.primitives import ZERO_UUID
from ingest.protocol.schema import (
    BOOL,
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

# Kafka's "no authorized operations reported" sentinel.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetadataResponseBroker(Struct):
    node_id: int = spec(INT32, "0+", entity="brokerId")
    host: str = spec(STRING, "0+")
    port: int = spec(INT32, "0+")
    rack: str | None = spec(STRING, "1+", nullable="1+", default=None, ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetadataResponsePartition(Struct):
    error_code: int = spec(INT16, "0+")
    partition_index: int = spec(INT32, "0+")
    leader_id: int = spec(INT32, "0+", entity="brokerId")
    leader_epoch: int = spec(INT32, "7+", default=-1, ignorable=True)
    replica_nodes: tuple[int, ...] = spec(array(INT32), "0+", entity="brokerId")
    isr_nodes: tuple[int, ...] = spec(array(INT32), "0+", entity="brokerId")
    offline_replicas: tuple[int, ...] = spec(array(INT32), "5+", entity="brokerId", ignorable=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetadataResponseTopic(Struct):
    error_code: int = spec(INT16, "0+")
    name: str | None = spec(STRING, "0+", entity="topicName", nullable="12+")
    topic_id: uuid.UUID = spec(UUID, "10+", default=ZERO_UUID, ignorable=True)
    is_internal: bool = spec(BOOL, "1+", default=False, ignorable=True)
    partitions: tuple[MetadataResponsePartition, ...] = spec(array(MetadataResponsePartition), "0+")
    topic_authorized_operations: int = spec(INT32, "8+", default=AUTHORIZED_OPERATIONS_OMITTED)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetadataResponse(Response):
    api_key: ClassVar[int] = 3
    valid_versions: ClassVar[str] = "1-12"
    flexible_versions: ClassVar[str] = "9+"

    throttle_time_ms: int = spec(INT32, "3+", ignorable=True)
    brokers: tuple[MetadataResponseBroker, ...] = spec(array(MetadataResponseBroker), "0+")
    cluster_id: str | None = spec(STRING, "2+", nullable="2+", default=None, ignorable=True)
    controller_id: int = spec(INT32, "1+", entity="brokerId", default=-1, ignorable=True)
    topics: tuple[MetadataResponseTopic, ...] = spec(array(MetadataResponseTopic), "0+")
    cluster_authorized_operations: int = spec(INT32, "8-10", default=AUTHORIZED_OPERATIONS_OMITTED)


@dataclass(frozen=True, kw_only=True, slots=True)
class MetadataRequestTopic(Struct):
    topic_id: uuid.UUID = spec(UUID, "10+", default=ZERO_UUID, ignorable=True)
    name: str | None = spec(STRING, "0+", entity="topicName", nullable="10+")


@dataclass(frozen=True, kw_only=True, slots=True)
class MetadataRequest(Request):
    """``topics=None`` asks for every topic; an empty tuple asks for none."""

    api_key: ClassVar[int] = 3
    valid_versions: ClassVar[str] = "1-12"
    flexible_versions: ClassVar[str] = "9+"
    response_type: ClassVar[type[Response]] = MetadataResponse

    topics: tuple[MetadataRequestTopic, ...] | None = spec(
        array(MetadataRequestTopic), "0+", nullable="1+"
    )
    allow_auto_topic_creation: bool = spec(BOOL, "4+", default=True)
    include_cluster_authorized_operations: bool = spec(BOOL, "8-10")
    include_topic_authorized_operations: bool = spec(BOOL, "8+")
