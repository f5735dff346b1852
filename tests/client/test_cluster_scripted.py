"""Cluster logic against scripted brokers: bootstrap order, leader refresh, coordinator retries."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ingest.client import ClientConfig, Cluster
from ingest.errors import BrokerError, KafkaConnectionError
from ingest.protocol.codec import SUPPORTED_VERSIONS
from ingest.protocol.headers import RequestHeader
from ingest.protocol.messages import (
    EARLIEST_TIMESTAMP,
    Coordinator,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from ingest.protocol.partition import Partition
from tests.client.peer import PeerConnection, ScriptedPeer, kafka_script

FIND_COORDINATOR = FindCoordinatorRequest.api_key
TOPIC_ID = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")


def make_config(bootstrap: str, **overrides: Any) -> ClientConfig:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "request_timeout": 2.0,
        "retry_timeout": 3.0,
        "retry_backoff": 0.01,
        "retry_backoff_max": 0.02,
        "reconnect_backoff": 0.01,
        "reconnect_backoff_max": 0.02,
    }
    settings.update(overrides)
    return ClientConfig(**settings)


class ScriptedCluster:
    """One scripted broker (node 1) with topic "t" of two partitions, counting requests."""

    def __init__(self, *, ranges: dict[int, tuple[int, int]] | None = None) -> None:
        self.port = 0
        self.metadata_requests: list[Any] = []
        self.list_offsets_errors: list[int] = []  # error codes to answer, in turn, for partition 1
        self.coordinator_errors: list[int] = []
        self.coordinator_requests: list[tuple[int, Any]] = []
        handlers = {
            MetadataRequest.api_key: self.metadata,
            ListOffsetsRequest.api_key: self.list_offsets,
            FIND_COORDINATOR: self.find_coordinator,
        }
        self.peer = ScriptedPeer(kafka_script(handlers, ranges=ranges))
        self.port = self.peer.port

    def metadata(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        self.metadata_requests.append(request)
        partitions = tuple(
            MetadataResponsePartition(
                partition_index=index,
                leader_id=1,
                leader_epoch=3,
                replica_nodes=(1,),
                isr_nodes=(1,),
            )
            for index in (0, 1)
        )
        return MetadataResponse(
            brokers=(MetadataResponseBroker(node_id=1, host="127.0.0.1", port=self.port),),
            cluster_id="scripted",
            controller_id=1,
            topics=(MetadataResponseTopic(name="t", topic_id=TOPIC_ID, partitions=partitions),),
        )

    def list_offsets(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                code = 0
                if p.partition_index == 1 and self.list_offsets_errors:
                    code = self.list_offsets_errors.pop(0)
                answers.append(
                    ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=code,
                        offset=-1 if code else 40 + p.partition_index,
                        timestamp=-1,
                    )
                )
            topics.append(ListOffsetsTopicResponse(name=topic.name, partitions=tuple(answers)))
        return ListOffsetsResponse(topics=tuple(topics))

    def find_coordinator(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        self.coordinator_requests.append((header.request_api_version, request))
        code = self.coordinator_errors.pop(0) if self.coordinator_errors else 0
        if header.request_api_version >= 4:
            return FindCoordinatorResponse(
                coordinators=tuple(
                    Coordinator(
                        key=key, node_id=1, host="127.0.0.1", port=self.port, error_code=code
                    )
                    for key in request.coordinator_keys
                )
            )
        return FindCoordinatorResponse(error_code=code, node_id=1, host="127.0.0.1", port=self.port)

    def __enter__(self) -> ScriptedCluster:
        self.peer.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.peer.__exit__(*exc_info)


def closed_port() -> int:
    with ScriptedPeer(lambda peer: None) as peer:
        return peer.port


def test_bootstrap_uses_the_first_server_that_answers() -> None:
    dead = closed_port()
    with ScriptedCluster() as scripted:
        config = make_config(f"127.0.0.1:{dead},127.0.0.1:{scripted.port}")
        with Cluster(config) as cluster:
            view = cluster.bootstrap()
            assert [b.node_id for b in view.brokers] == [1]
            assert cluster.cluster_id == "scripted"
            topic = view.topic("t")
            assert topic is not None and topic.topic_id == TOPIC_ID
            assert [p.leader_epoch for p in topic.partitions] == [3, 3]
            # The bootstrap connection is reused for node 1: one connection per broker.
            assert cluster.connection(1).connects == 1
        assert scripted.peer.accepted == 1


def test_bootstrap_failure_names_every_server() -> None:
    first, second = closed_port(), closed_port()
    config = make_config(f"127.0.0.1:{first},127.0.0.1:{second}", retry_timeout=0.2)
    with Cluster(config) as cluster, pytest.raises(KafkaConnectionError) as info:
        cluster.bootstrap()
    assert f"127.0.0.1:{first}" in str(info.value) and f"127.0.0.1:{second}" in str(info.value)


def test_metadata_asks_for_topics_without_creating_them() -> None:
    with (
        ScriptedCluster() as scripted,
        Cluster(make_config(f"127.0.0.1:{scripted.port}")) as cluster,
    ):
        cluster.refresh_metadata(["t", "t", "u"])
        request = scripted.metadata_requests[-1]
        assert [t.name for t in request.topics] == ["t", "u"]
        assert request.allow_auto_topic_creation is False


def test_not_leader_refreshes_the_leader_cache_and_retries() -> None:
    with (
        ScriptedCluster() as scripted,
        Cluster(make_config(f"127.0.0.1:{scripted.port}")) as cluster,
    ):
        cluster.bootstrap()
        scripted.list_offsets_errors = [6, 5]  # NOT_LEADER_OR_FOLLOWER, then LEADER_NOT_AVAILABLE
        before = len(scripted.metadata_requests)
        offsets = cluster.list_offsets(
            {Partition("t", 0): EARLIEST_TIMESTAMP, Partition("t", 1): EARLIEST_TIMESTAMP}
        )
        assert {tp: o.offset for tp, o in offsets.items()} == {
            Partition("t", 0): 40,
            Partition("t", 1): 41,
        }
        # Each leader error dropped the cached leader: two refreshes, for "t" only.
        refreshes = scripted.metadata_requests[before:]
        assert len(refreshes) == 2
        assert all([t.name for t in r.topics] == ["t"] for r in refreshes)


def test_a_fatal_partition_error_names_the_partition() -> None:
    with (
        ScriptedCluster() as scripted,
        Cluster(make_config(f"127.0.0.1:{scripted.port}")) as cluster,
    ):
        cluster.bootstrap()
        scripted.list_offsets_errors = [29]  # TOPIC_AUTHORIZATION_FAILED
        with pytest.raises(BrokerError) as info:
            cluster.list_offsets({Partition("t", 1): EARLIEST_TIMESTAMP})
    message = str(info.value)
    assert info.value.name == "TOPIC_AUTHORIZATION_FAILED" and not info.value.retriable
    assert f"broker 127.0.0.1:{scripted.port} (node 1), ListOffsets v7" in message
    assert ", t-1: TOPIC_AUTHORIZATION_FAILED" in message  # one spelling: Partition.__str__


@pytest.mark.parametrize("version", [4, 3])
def test_find_coordinator_retries_until_the_coordinator_is_ready(version: int) -> None:
    ranges = {**SUPPORTED_VERSIONS, FIND_COORDINATOR: (0, version)}
    with ScriptedCluster(ranges=ranges) as scripted:
        # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, then found.
        scripted.coordinator_errors = [14, 15, 16]
        with Cluster(make_config(f"127.0.0.1:{scripted.port}")) as cluster:
            found = cluster.find_coordinators(["g1"])
        assert found["g1"].node_id == 1 and found["g1"].port == scripted.port
        assert len(scripted.coordinator_requests) == 4
        assert {v for v, _ in scripted.coordinator_requests} == {version}
        request = scripted.coordinator_requests[-1][1]
        if version >= 4:
            assert request.coordinator_keys == ("g1",)
        else:
            assert request.key == "g1"


def test_find_coordinator_v3_pipelines_one_request_per_key() -> None:
    ranges = {**SUPPORTED_VERSIONS, FIND_COORDINATOR: (0, 3)}
    with ScriptedCluster(ranges=ranges) as scripted:
        with Cluster(make_config(f"127.0.0.1:{scripted.port}")) as cluster:
            found = cluster.find_coordinators(["a", "b", "c"])
        assert sorted(found) == ["a", "b", "c"]
        assert [r.key for _, r in scripted.coordinator_requests] == ["a", "b", "c"]


def test_find_coordinator_gives_up_after_the_retry_timeout() -> None:
    with ScriptedCluster() as scripted:
        scripted.coordinator_errors = [15] * 1000
        config = make_config(f"127.0.0.1:{scripted.port}", retry_timeout=0.3)
        with Cluster(config) as cluster, pytest.raises(BrokerError) as info:
            cluster.find_coordinator("g1")
    assert info.value.name == "COORDINATOR_NOT_AVAILABLE" and info.value.retriable
    assert "FindCoordinator v4, key 'g1'" in str(info.value)
    assert len(scripted.coordinator_requests) >= 3


def test_cached_leaders_expire_after_metadata_max_age() -> None:
    now = [1000.0]
    with ScriptedCluster() as scripted:
        config = make_config(f"127.0.0.1:{scripted.port}", metadata_max_age=60)
        with Cluster(config, clock=lambda: now[0]) as cluster:
            cluster.refresh_metadata(["t"])
            count = len(scripted.metadata_requests)
            assert cluster.leader("t", 1).node_id == 1
            assert len(scripted.metadata_requests) == count  # served from the cache
            now[0] += 61
            assert cluster.leader("t", 1).node_id == 1
            assert len(scripted.metadata_requests) == count + 1


def test_an_unknown_partition_is_an_error_naming_broker_topic_and_partition() -> None:
    with ScriptedCluster() as scripted:
        config = make_config(f"127.0.0.1:{scripted.port}", retry_timeout=0)
        with Cluster(config) as cluster, pytest.raises(BrokerError) as info:
            cluster.leader("t", 9)
    assert info.value.name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert f"broker 127.0.0.1:{scripted.port} (node 1), Metadata v12, t-9" in str(info.value)
